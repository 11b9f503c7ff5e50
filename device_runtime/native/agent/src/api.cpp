// The C API of edgefl_device.h over the C++ agent: a phone app or the edgefl-device binary starts, runs, stops
// and closes a device through these calls; user errors come back as one line and code 2, never as exceptions.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "agent.h"
#include "edgefl_device.h"
#include "energy.h"

using namespace edgefl::agent;

struct edgefl_device {
  std::unique_ptr<Link> link;
  std::unique_ptr<Agent> agent;
  LogFn log;
};

namespace {

std::string text(const char* s) { return s ? s : ""; }

std::pair<std::string, std::string> read_login(const std::string& path) {
  std::string body;
  if (!read_file(path, body))
    throw UserError("--credentials " + path + ": no such file; give the device's login file (credentials/<id>.json "
                    "of 'edgefl broker config')");
  const auto d = nlohmann::json::parse(body, nullptr, false);
  if (d.is_discarded() || !d.is_object() || d.size() != 2 || !d.contains("username") || !d.contains("password") ||
      !d["username"].is_string() || !d["password"].is_string())
    throw UserError("--credentials " + path + ": expected a JSON object with exactly the string keys 'username' and "
                    "'password'");
  return {d["username"].get<std::string>(), d["password"].get<std::string>()};
}

void check_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 4096;
  for (unsigned char c : id) ok = ok && c > 0x20 && c != 0x7f && !std::strchr("/+#:$", c);
  if (!ok)
    throw UserError("--id '" + id + "': a device id is one MQTT topic level and its login name: use letters, digits, "
                    "'-', '_' and '.'");
}

LogFn make_log(const edgefl_device_config* c) {
  const std::string id = text(c->id);
  edgefl_device_log_fn fn = c->log;
  void* user = c->user;
  return [=](int level, const std::string& line) {
    const std::string full = id + ": " + line;
    if (fn) fn(user, level, full.c_str());
    else {
      std::fprintf(stdout, "%s\n", full.c_str());
      std::fflush(stdout);
    }
  };
}

}  // namespace

extern "C" {

void edgefl_device_config_init(edgefl_device_config* c) {
  std::memset(c, 0, sizeof *c);
  c->runtime = "executorch";
  c->energy = "auto";
  c->threads = 1;
  c->i2c_bus = -1;
}

int edgefl_device_start(const edgefl_device_config* c, edgefl_device** device, char* why, size_t why_size) {
  *device = nullptr;
  try {
    check_id(text(c->id));
    if (text(c->broker).empty()) throw UserError("--broker: required (mqtt://HOST:PORT or mqtts://HOST:PORT)");
    if (text(c->runtime) != "executorch")
      throw UserError("--runtime " + text(c->runtime) + ": the native agent trains ExecuTorch sets only; run the Python "
                      "agent ('edgefl-device run') for ort or torch");
    const std::string data = absolute(text(c->data));
    if (data.empty() || access(data.c_str(), R_OK) != 0)
      throw UserError("--data " + data + ": no such file or folder; give a folder with x.npy and y.npy, or an .npz");
    const std::string trainer = text(c->trainer);
    if (trainer.empty() || access(trainer.c_str(), X_OK) != 0)
      throw UserError("the native trainer " + (trainer.empty() ? std::string("edgefl-et-train") : trainer) +
                      " is not there: build it with 'edgefl-device build-native', or give --trainer PATH");
    if (c->ca_file && access(c->ca_file, R_OK) != 0)
      throw UserError("--ca-file " + text(c->ca_file) + ": no such file; give the broker's CA certificate (tls/ca.crt "
                      "of 'edgefl broker config')");
    select_meter(text(c->energy), c->power_w, c->i2c_bus);   // a missing sensor or power figure fails now, not mid-round

    // one malloc arena (the MQTT client's threads would each keep their own), and large buffers (chunks, the
    // upload) always mapped apart and returned when freed: glibc's dynamic threshold would otherwise rise to the
    // chunk size after the first one and keep every later one in the heap. The agent idles small.
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    auto d = std::make_unique<edgefl_device>();
    d->log = make_log(c);
    LinkOptions lo;
    lo.device_id = text(c->id);
    lo.cache_dir = absolute(text(c->cache_dir));
    if (c->cache_budget_bytes > 0) lo.cache_budget_bytes = c->cache_budget_bytes;
    if (c->receipt_wait_s > 0) lo.receipt_s = c->receipt_wait_s;
    lo.wire.url = text(c->broker);
    lo.wire.client_id = lo.device_id;
    lo.wire.ca_file = text(c->ca_file);
    if (c->credentials) lo.wire.login = read_login(c->credentials);
    lo.wire.will_topic = "fl/v1/presence/" + lo.device_id;
    lo.wire.will_payload = nlohmann::json{{"online", false}, {"device", lo.device_id}, {"profile", nlohmann::json::object()},
                                          {"reason", "its connection was lost (last will)"}}.dump();
    AgentConfig ac;
    ac.device_id = lo.device_id;
    ac.data = data;
    ac.runtime = text(c->runtime);
    ac.trainer = absolute(trainer);
    ac.profile = text(c->profile);
    ac.energy = text(c->energy);
    ac.memory_bytes = c->memory_bytes;
    ac.power_w = c->power_w;
    ac.i2c_bus = c->i2c_bus;
    ac.threads = c->threads > 0 ? c->threads : 1;
    ac.rounds = c->rounds;
    ac.enforce_memory = c->enforce_memory != 0;
    if (c->fetch_timeout_s > 0) ac.fetch_timeout_s = c->fetch_timeout_s;
    if (ac.enforce_memory && ac.memory_bytes <= 0)
      throw UserError("--enforce-memory needs the device's memory: give --memory, e.g. --memory 180MiB");
    d->link = std::make_unique<Link>(lo, d->log);
    d->agent = std::make_unique<Agent>(ac, *d->link, d->log);
    d->link->announce(d->agent->profile_json());
    *device = d.release();
    return 0;
  } catch (const UserError& e) {
    std::snprintf(why, why_size, "%s", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::snprintf(why, why_size, "internal error: %s", e.what());
    return 1;
  }
}

int edgefl_device_run(edgefl_device* d) {
  try {
    return d->agent->serve();
  } catch (const std::exception& e) {
    d->log(EDGEFL_LOG_ERROR, std::string("internal error: ") + e.what());
    return -1;
  }
}

void edgefl_device_stop(edgefl_device* d) {
  if (d) d->link->stop();
}

void edgefl_device_close(edgefl_device* d) {
  if (!d) return;
  d->link->close();
  delete d;
}

}  // extern "C"
