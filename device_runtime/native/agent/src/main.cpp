// edgefl-device (native): join a coordinator over MQTT and train what it sends, without Python. A thin main
// over the library of edgefl_device.h; its flags are those of `edgefl-device run` (device_runtime/run_cmd.py).
// A device has no YAML parser: --profile is only announced, the profile's memory and power come as --memory
// and --power (`edgefl fleet up --agent native` passes them from the profile).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "edgefl_device.h"

namespace {

const char* const USAGE =
    "usage: edgefl-device [run] --id ID --broker URL --data DATA [--credentials FILE] [--ca-file FILE]\n"
    "                     [--runtime executorch] [--trainer PATH] [--cache DIR] [--cache-budget SIZE]\n"
    "                     [--memory SIZE] [--profile NAME] [--power WATTS] [--energy auto|rapl|battery|ina219|profile]\n"
    "                     [--receipt-wait S] [--threads N] [--enforce-memory] [--rounds N] [--i2c-bus N]\n";

struct Bad {
  std::string line;
};

// "128MiB", "180MB", "1.5GiB", "4096" -> bytes (edgefl.units.parse_bytes)
int64_t size_option(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double n = std::strtod(v.c_str(), &end);
  const std::string unit = end ? end : "";
  static const std::map<std::string, double> units = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"kB", 1e3}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
  auto u = units.find(unit);
  if (v.empty() || end == v.c_str() || u == units.end() || !(n >= 0))
    throw Bad{flag + " " + v + ": not a size; give e.g. 128MiB, 180MB or a number of bytes"};
  return static_cast<int64_t>(std::llround(n * u->second));
}

double number_option(const std::string& flag, const std::string& v, const char* suffix, double minimum) {
  std::string s = v;
  if (suffix && s.size() > std::strlen(suffix) && s.compare(s.size() - std::strlen(suffix), std::strlen(suffix), suffix) == 0)
    s.resize(s.size() - std::strlen(suffix));
  char* end = nullptr;
  const double n = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || !(n >= minimum))
    throw Bad{flag + " " + v + ": expected a number >= " + std::to_string(static_cast<int>(minimum)) +
              (suffix ? std::string(" (e.g. 3") + suffix + ")" : std::string())};
  return n;
}

std::string beside_me(const char* name) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.find_last_of('/') + 1) + name;
}

edgefl_device* g_device = nullptr;

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> v;
  bool enforce = false;
  try {
    int i = 1;
    if (i < argc && std::strcmp(argv[i], "run") == 0) i++;
    for (; i < argc; i++) {
      const std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") {
        std::fputs(USAGE, stdout);
        return 0;
      }
      if (flag == "--enforce-memory") {
        enforce = true;
        continue;
      }
      static const char* known[] = {"--id", "--broker", "--credentials", "--ca-file", "--data", "--runtime", "--trainer",
                                    "--cache", "--cache-budget", "--memory", "--profile", "--power", "--energy",
                                    "--receipt-wait", "--threads", "--rounds", "--i2c-bus"};
      bool ok = false;
      for (const char* k : known) ok = ok || flag == k;
      if (!ok) throw Bad{flag + ": unknown option; see edgefl-device --help"};
      if (i + 1 >= argc) throw Bad{flag + ": needs a value"};
      v[flag] = argv[++i];
    }
    for (const char* required : {"--id", "--broker", "--data"})
      if (!v.count(required)) throw Bad{std::string(required) + " is required; see edgefl-device --help"};
  } catch (const Bad& b) {
    std::fprintf(stderr, "edgefl-device: error: %s\n", b.line.c_str());
    return 2;
  }
  const auto get = [&](const char* k) { return v.count(k) ? v[k].c_str() : nullptr; };
  std::string trainer = v.count("--trainer") ? v["--trainer"] : "";
  if (trainer.empty() && std::getenv("EDGEFL_ET_TRAIN")) trainer = std::getenv("EDGEFL_ET_TRAIN");
  if (trainer.empty()) trainer = beside_me("edgefl-et-train");
  std::string cache = v.count("--cache") ? v["--cache"] : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") +
                                                              "/.cache/edgefl-device";
  edgefl_device_config c;
  edgefl_device_config_init(&c);
  try {
    c.id = get("--id");
    c.broker = get("--broker");
    c.credentials = get("--credentials");
    c.ca_file = get("--ca-file");
    c.data = get("--data");
    if (get("--runtime")) c.runtime = get("--runtime");
    c.trainer = trainer.c_str();
    c.cache_dir = cache.c_str();
    c.profile = get("--profile");
    if (get("--energy")) c.energy = get("--energy");
    if (get("--memory")) c.memory_bytes = size_option("--memory", v["--memory"]);
    c.cache_budget_bytes = size_option("--cache-budget", v.count("--cache-budget") ? v["--cache-budget"] : "128MiB");
    if (get("--power")) c.power_w = number_option("--power", v["--power"], "W", 0);
    if (get("--receipt-wait")) c.receipt_wait_s = number_option("--receipt-wait", v["--receipt-wait"], nullptr, 0);
    if (get("--threads")) c.threads = static_cast<int>(number_option("--threads", v["--threads"], nullptr, 1));
    if (get("--rounds")) c.rounds = static_cast<int>(number_option("--rounds", v["--rounds"], nullptr, 1));
    if (get("--i2c-bus")) c.i2c_bus = static_cast<int>(number_option("--i2c-bus", v["--i2c-bus"], nullptr, 0));
    c.enforce_memory = enforce;
  } catch (const Bad& b) {
    std::fprintf(stderr, "edgefl-device: error: %s\n", b.line.c_str());
    return 2;
  }
  // SIGTERM / SIGINT are taken by one thread (blocked everywhere else, the MQTT client's threads included), which
  // stops the device: a fetch ends at once, a training child is killed, and main says goodbye
  sigset_t stopping;
  sigemptyset(&stopping);
  sigaddset(&stopping, SIGTERM);
  sigaddset(&stopping, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stopping, nullptr);
  static std::atomic<bool> stop_asked{false};
  std::thread([stopping] {
    int sig = 0;
    sigwait(&stopping, &sig);
    stop_asked = true;
    if (g_device) edgefl_device_stop(g_device);
  }).detach();

  char why[1024];
  const int rc = edgefl_device_start(&c, &g_device, why, sizeof why);
  if (rc != 0) {
    std::fprintf(stderr, "edgefl-device: error: %s\n", why);
    return rc;
  }
  std::printf("%s: online at %s, runtime %s (native agent, trainer %s)%s\n", c.id, c.broker, c.runtime, c.trainer,
              c.memory_bytes ? (", memory " + std::to_string(c.memory_bytes) + " B").c_str() : "");
  std::fflush(stdout);
  if (stop_asked) edgefl_device_stop(g_device);
  edgefl_device_run(g_device);
  edgefl_device_close(g_device);
  return 0;
}
