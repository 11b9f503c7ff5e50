#include "agent.h"

#include <malloc.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "child.h"
#include "energy.h"
#include "local_data.h"

namespace edgefl::agent {

using nlohmann::json;

namespace {

const int64_t CHUNK_SIZE = 1 << 20;

// The data of a float32 .npy the trainer wrote (its upload), or why not.
bool npy_f32_data(const std::string& bytes, std::string& data, std::string& why) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return why = "not an .npy file", false;
  const unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    start = 10;
  } else {
    if (bytes.size() < 12) return why = "a cut .npy header", false;
    header_len = 0;
    for (int i = 3; i >= 0; i--) header_len = header_len << 8 | static_cast<unsigned char>(bytes[8 + i]);
    start = 12;
  }
  if (start + header_len > bytes.size()) return why = "a cut .npy header", false;
  const std::string header = bytes.substr(start, header_len);
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    return why = "not a C-ordered float32 array", false;
  data = bytes.substr(start + header_len);
  return true;
}

std::string temp_folder() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/edgefl-round-XXXXXX";
  if (!mkdtemp(&pattern[0])) return "";
  return pattern;
}

}  // namespace

// One round's answer: the report's summary, and the upload buffer with its order when it trained.
struct Agent::Outcome {
  json report;
  std::string buffer;
  json order = json::array();
};

Agent::Agent(AgentConfig config, Link& link, LogFn log)
    : c_(std::move(config)), link_(link), log_(log), fetcher_(link, log) {
  if (c_.enforce_memory && c_.memory_bytes <= 0)
    throw UserError("--enforce-memory needs the device's memory: give --memory, e.g. --memory 180MiB");
  idle_rss_ = vm_status("VmRSS");
}

std::string Agent::profile_json() const {
  struct utsname host {};
  uname(&host);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return json{{"runtime", c_.runtime},
              {"memory_bytes", c_.memory_bytes > 0 ? json(c_.memory_bytes) : json()},
              {"ram_bytes", static_cast<int64_t>(pages) * page},
              {"cpu_count", sysconf(_SC_NPROCESSORS_ONLN)},
              {"machine", host.machine},
              {"python", nullptr},
              {"runtimes", {c_.runtime}},
              {"trainer", "native"},
              {"agent", "native"},
              {"profile", c_.profile.empty() ? json() : json(c_.profile)},
              {"power_w", c_.power_w}}
      .dump();
}

int Agent::serve() {
  int done = 0;
  bool trimmed = true;
  while (!link_.stopping() && (c_.rounds <= 0 || done < c_.rounds)) {
    auto job = link_.next_instruction(1.0);
    if (!job) {
      if (!trimmed) malloc_trim(0);    // a round's buffers (the upload, freed on its receipt) go back to the system
      trimmed = true;
      continue;
    }
    trimmed = false;
    if (job->instruction && link_.answered(*job->instruction)) continue;
    idle_rss_ = vm_status("VmRSS");     // the agent waiting: what it holds between rounds
    if (job->instruction) fetcher_.assign(job->instruction->shared);
    Outcome out;
    const bool answered = handle(*job, out);
    malloc_trim(0);                      // give back what the round's messages took: the agent idles small
    if (link_.stopping()) break;         // a round cut short says nothing worth sending
    const auto late = link_.superseded(job->round());
    if (!answered || late) {             // the round ended while this device fetched or trained: nobody takes it
      log_(EDGEFL_LOG_INFO, "round " + std::to_string(job->round()) + ": dropped: " +
                                (late ? *late : std::string("its fetch ended")));
      continue;
    }
    send_report(out);
    malloc_trim(0);
    done++;
    const json& r = out.report;
    log_(EDGEFL_LOG_INFO, "round " + std::to_string(job->round()) + ": " + r["status"].get<std::string>() +
                              (r["reason"].get<std::string>().empty()
                                   ? ", loss " + (r["loss_after"].is_number() ? r["loss_after"].dump() : "none")
                                   : " (" + r["reason"].get<std::string>() + ")"));
  }
  return done;
}

bool Agent::handle(const Job& job, Outcome& out) {
  const double t0 = now_s();
  json& report = out.report;
  report = json{{"round", job.round()}, {"device_id", c_.device_id}, {"status", "failed"}, {"examples", 0},
                {"loss_before", nullptr}, {"loss_after", nullptr}, {"wall_s", 0.0}, {"peak_rss_bytes", nullptr},
                {"activation_bytes", nullptr}, {"upload_bytes", 0}, {"download_bytes", 0}, {"reason", ""},
                {"metrics", json::object()}, {"upload", ""}};
  if (job.unreadable) {
    report["config_hash"] = job.unreadable->config_hash;
    report["reason"] = "refused: " + job.unreadable->reason;
    return true;
  }
  const Instruction& ins = *job.instruction;
  report["config_hash"] = ins.config_hash;
  if (c_.memory_bytes > 0 && ins.predicted_peak_bytes && *ins.predicted_peak_bytes > c_.memory_bytes) {
    report["reason"] = "refused: predicted peak " + std::to_string(*ins.predicted_peak_bytes) +
                       " B exceeds this device's declared memory " + std::to_string(c_.memory_bytes) + " B";
    return true;
  }
  auto set = ins.artifacts.find("set");
  if (set == ins.artifacts.end()) {
    std::string roles;
    for (const auto& kv : ins.artifacts) roles += (roles.empty() ? "" : ", ") + kv.first;
    report["reason"] = "refused: the instruction names no artifact set (roles: " + roles + ")";
    return true;
  }
  std::string folder;
  SetManifest suffix;
  try {
    folder = fetcher_.fetch_artifact(set->second, c_.fetch_timeout_s);
    std::string text, why;
    if (!read_file(folder + "/manifest.json", text) || !parse_set_manifest(text, suffix, why))
      throw FetchFailed(folder + "/manifest.json: " + why);
  } catch (const FetchEnded&) {
    return false;
  } catch (const FetchFailed& e) {
    report["reason"] = std::string("artifact: ") + e.what();
    return true;
  }
  if (suffix.backend != c_.runtime) {
    report["reason"] = "refused: artifact exported for " + suffix.backend + ", this device trains with " + c_.runtime;
    return true;
  }
  if (link_.superseded(ins.round)) return false;
  // the wrong data fails the round here, in one line naming the file, not in the trainer
  if (const std::string why = check_local_data(c_.data, folder); !why.empty()) {
    report["reason"] = "data: " + why;
    return true;
  }

  const std::string tmp = temp_folder();
  const std::string upload = tmp + "/upload.npy";
  std::vector<std::string> argv = {c_.trainer, "--artifacts", folder, "--data", c_.data, "--out", upload,
                                   "--lr", format_double(ins.lr), "--seed", std::to_string(ins.seed),
                                   "--epochs", std::to_string(ins.local_epochs), "--threads", std::to_string(c_.threads)};
  if (ins.max_examples && *ins.max_examples > 0) {
    argv.push_back("--max-examples");
    argv.push_back(std::to_string(*ins.max_examples));
  }
  auto meter = select_meter(c_.energy, c_.power_w, c_.i2c_bus);
  const double metered_from = now_s();
  meter->start();
  std::unique_ptr<MemoryCap> cap;
  // the budget is the whole device's: the training process gets what this agent does not hold
  if (c_.enforce_memory)
    cap = std::make_unique<MemoryCap>(std::max<int64_t>(c_.memory_bytes - vm_status("VmRSS"), 1),
                                      "edgefl-" + c_.device_id);
  bool over = false;
  ChildResult child = run_child(argv, c_.threads, cap.get(), [&] {
    for (int i = 0; i < 64; i++)    // keep the link's view current while the child trains
      if (!link_.pump(0)) break;
    over = link_.stopping() || link_.superseded(ins.round).has_value();
    return !over;
  });
  if (child.returncode != 0 && cap && (cap->oom_killed() || child.returncode == -9) && !over)
    child.error = "out of memory: the training process was killed at its cap " + cap->describe();
  cap.reset();
  EnergyReading energy;
  try {
    energy = meter->stop();
  } catch (const std::exception& e) {   // a sensor that failed mid-round: the training stands, its energy is flagged
    const double s = now_s() - metered_from;
    energy = {c_.power_w * s, s, "profile", true};
    log_(EDGEFL_LOG_WARNING, std::string("energy: ") + e.what() + "; this round reports the profile's estimate");
  }
  if (over) {
    remove_tree(tmp);
    return false;
  }
  json result = json::parse(child.result.empty() ? "{}" : child.result, nullptr, false);
  if (result.is_discarded() || !result.is_object()) result = json::object();
  report["wall_s"] = now_s() - t0;
  const json peak = result.value("peak_rss_bytes", json());
  const int64_t child_peak = peak.is_number_integer() && peak.get<int64_t>() > 0 ? peak.get<int64_t>()
                                                                                 : child.max_rss_bytes;
  json& metrics = report["metrics"];
  metrics = {{"max_rss_bytes", child.max_rss_bytes}, {"runtime", c_.runtime},
             {"cache_bytes", link_.cache().trim(folder)}, {"energy", json::parse(energy.to_json())},
             {"agent", "native"}, {"agent_idle_rss_bytes", idle_rss_}, {"child_peak_bytes", child_peak}};
  // the device's peak is the training process's and this agent's, which stays resident beside it (as the plan
  // predicts it); taken again once the upload is read in, and once it is sent (send_report)
  auto whole_device = [&] {
    metrics["agent_peak_bytes"] = vm_status("VmHWM");
    report["peak_rss_bytes"] = child_peak + metrics["agent_peak_bytes"].get<int64_t>();
  };
  whole_device();
  if (child.returncode != 0) {
    report["reason"] = child.error;
    remove_tree(tmp);
    return true;
  }
  std::string bytes, why;
  int64_t values = 0;
  for (const auto& t : suffix.trainable) values += t.numel();
  const bool read = read_file(upload, bytes) && npy_f32_data(bytes, out.buffer, why);
  bytes.clear();
  bytes.shrink_to_fit();
  remove_tree(tmp);
  if (!read || static_cast<int64_t>(out.buffer.size()) != 4 * values) {
    report["reason"] = "the trainer's upload: " + (why.empty() ? std::to_string(out.buffer.size()) + " bytes, the "
                       "manifest's trainable tensors hold " + std::to_string(4 * values) : why);
    out.buffer.clear();
    return true;
  }
  for (const auto& t : suffix.trainable) out.order.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}});
  whole_device();
  report["status"] = "ok";
  report["examples"] = result.value("examples", 0);
  report["loss_before"] = result.value("loss_first", json());
  report["loss_after"] = result.value("loss_last", json());
  // what calibration checks against the plan (edgefl.cost.calibrate): the batch trained and how data was read
  for (const char* k : {"steps", "batch_size", "data_read", "torch_loaded", "trainer"})
    metrics[k] = result.value(k, json());
  metrics["train_wall_s"] = result.value("wall_s", json());
  return true;
}

void Agent::send_report(Outcome& out) {
  json& report = out.report;
  const int64_t round = report["round"];
  const std::string name = random_hex(8);
  report["upload"] = name;
  report["schema"] = "edgefl.report/1";
  const int64_t size = std::min<int64_t>(CHUNK_SIZE, link_.wire().max_packet_size() - 1024);
  const int64_t n = static_cast<int64_t>(out.buffer.size());
  const int64_t chunks = (n + size - 1) / size;
  const Traffic down = link_.downloaded(round);
  const std::string base = "fl/v1/dev/" + c_.device_id + "/up/result/" + std::to_string(round) + "/" + name;
  const std::string digest = sha256_hex(out.buffer);
  Upload u;
  u.round = round;
  u.name = name;
  u.config_hash = report["config_hash"];
  for (int64_t seq = 0; seq < chunks; seq++)
    u.messages.emplace_back(base + "/c/" + std::to_string(seq),
                            out.buffer.substr(static_cast<size_t>(seq * size), static_cast<size_t>(size)));
  out.buffer.clear();
  out.buffer.shrink_to_fit();
  link_.report(std::move(u));
  bool acked = link_.flush(60);
  // the agent's peak taken again once the chunks are out, so that the report counts the upload's copies (the
  // chunks, the MQTT client's); a round that started no training has no peaks
  if (report.contains("metrics") && report["metrics"].contains("child_peak_bytes")) {
    json& metrics = report["metrics"];
    metrics["agent_peak_bytes"] = vm_status("VmHWM");
    report["peak_rss_bytes"] = metrics["child_peak_bytes"].get<int64_t>() + metrics["agent_peak_bytes"].get<int64_t>();
  }
  const json meta = {{"schema", "edgefl.upload/2"},
                     {"report", report},
                     {"tensors", {{"order", out.order}, {"bytes", n}, {"sha256", digest}, {"chunks", chunks}}},
                     {"download", {{"messages", down.messages}, {"payload_bytes", down.payload_bytes},
                                   {"wire_bytes", down.wire_bytes}}}};
  link_.report_more(name, base + "/meta", meta.dump());
  acked = link_.flush(60) && acked;
  if (!acked)
    log_(EDGEFL_LOG_WARNING, "the broker did not acknowledge the round-" + std::to_string(round) +
                                 " report within 60 s; it is sent again when the connection is back");
}

}  // namespace edgefl::agent
