// edgefl-et-train: train an ExecuTorch artifact set on local data without Python or torch.
//
//   edgefl-et-train --artifacts SET --data DATA [--out upload.npy] [--lr 0.05] [--seed 0]
//                   [--epochs 1 [--max-examples K] | --steps N] [--eval-examples 0] [--threads 1] [--losses]
//                   [--kernels edgefl|shipped]
//
// Batches follow edgefl's device schedule (docs/artifact-format.md): --epochs E passes, each over
// numpy's default_rng(seed).permutation(examples), cut to its first K (--max-examples: the examples the
// plan's FLOPs assume), in batches of the set's batch, the smaller remainder skipped; --steps N draws sorted batches from successive permutations (edgefl-device train). The
// report, one JSON line on stdout, carries losses, step time and peak RSS (VmHWM). A user's mistake is
// one line on stderr and exit 2, and the upload is written only when training finished.
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "artifact_set.h"
#include "errors.h"
#include "et_trainer.h"
#include "fast_kernels.h"
#include "gemm.h"
#include "json_fields.h"
#include "local_data.h"
#include "npy.h"
#include "numpy_random.h"

#ifndef EDGEFL_VERSION
#define EDGEFL_VERSION "0"
#endif

namespace edgefl {
namespace {

const char* const USAGE =
    "usage: edgefl-et-train --artifacts SET --data DATA [--out UPLOAD.npy] [--lr LR] [--seed S]\n"
    "                       [--epochs E [--max-examples K] | --steps N] [--eval-examples N] [--threads T]\n"
    "                       [--losses] [--no-verify] [--kernels edgefl|shipped]\n";

struct Options {
  std::string artifacts, data, out;
  double lr = 0.05;
  uint64_t seed = 0;
  int64_t epochs = 1, steps = 0, eval_examples = 0, threads = 1, max_examples = 0;
  bool losses = false, verify = true;
  // edgefl: edgefl's float32 kernels ahead of the shipped ones (fast_kernels.h); shipped: the wheel's, but for
  // edgefl's fix of the max pool's backward (register_fixes), whose shipped kernel computes wrong gradients
  // (the benchmark compares the two in one run)
  std::string kernels = "edgefl";
};

int64_t integer(const std::string& flag, const std::string& value, int64_t minimum) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end || v < minimum)
    throw UserError(flag + ": expected an integer >= " + std::to_string(minimum) + ", got '" + value + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, std::string*> text{{"--artifacts", &o.artifacts}, {"--data", &o.data}, {"--out", &o.out}};
  for (int i = 1; i < argc; i++) {
    const std::string flag = argv[i];
    if (flag == "--losses") { o.losses = true; continue; }
    if (flag == "--no-verify") { o.verify = false; continue; }
    if (i + 1 >= argc) throw UserError(flag + ": unknown option or missing value\n" + USAGE);
    const std::string value = argv[++i];
    if (text.count(flag)) *text[flag] = value;
    else if (flag == "--lr") {
      char* end = nullptr;
      o.lr = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(o.lr >= 0)) throw UserError("--lr: expected a number >= 0, got '" + value + "'");
    } else if (flag == "--seed") o.seed = static_cast<uint64_t>(integer(flag, value, 0));
    else if (flag == "--epochs") o.epochs = integer(flag, value, 1);
    else if (flag == "--steps") o.steps = integer(flag, value, 1);
    else if (flag == "--max-examples") o.max_examples = integer(flag, value, 1);
    else if (flag == "--eval-examples") o.eval_examples = integer(flag, value, 0);
    else if (flag == "--threads") o.threads = integer(flag, value, 1);
    else if (flag == "--kernels") {
      if (value != "edgefl" && value != "shipped")
        throw UserError("--kernels: expected edgefl or shipped, got '" + value + "'");
      o.kernels = value;
    }
    else throw UserError(flag + ": unknown option\n" + USAGE);
  }
  if (o.artifacts.empty() || o.data.empty()) throw UserError(std::string("--artifacts and --data are required\n") + USAGE);
  return o;
}

int64_t vm_status(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(status, line))
    if (line.compare(0, n, field) == 0 && line[n] == ':') return std::atoll(line.c_str() + n + 1) * 1024;
  return 0;
}

// The peak RSS of each phase of a run (load, train, upload), by resetting VmHWM after each (Linux >= 4.0:
// /proc/self/clear_refs); the process's peak is the largest. Once a reset is refused, the later phases' own
// peaks are not known (null); the whole peak still is. Mirrors the Python trainer's report.
struct PhasePeaks {
  Json peaks = Json::object();
  int64_t whole = 0;
  bool split = true;

  void end(const char* phase) {
    const int64_t peak = vm_status("VmHWM");
    whole = std::max(whole, peak);
    peaks[phase] = split ? Json(peak) : Json();
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";
    reset.flush();
    split = split && static_cast<bool>(reset);
  }
};

Json evaluate(EtTrainer& trainer, LocalData& data, int64_t examples) {
  double loss = 0;
  int64_t counted = 0, correct = 0;
  std::vector<int64_t> rows, y;
  std::vector<unsigned char> x;
  for (int64_t start = 0; start < examples; start += trainer.batch()) {
    rows.clear();
    for (int64_t i = start; i < std::min(examples, start + trainer.batch()); i++) rows.push_back(i);
    data.gather(rows, x, y);
    auto e = trainer.eval_batch(x, y, static_cast<int64_t>(rows.size()));
    loss += e.loss_sum;
    counted += e.counted;
    correct += e.correct;
  }
  auto out = Json::object();
  out["loss"] = loss / std::max<int64_t>(counted, 1);
  out["accuracy"] = static_cast<double>(correct) / std::max<int64_t>(counted, 1);
  return out;
}

// The batches of one run, in order (see the header comment).
std::vector<std::vector<int64_t>> schedule(const Options& o, int64_t examples, int64_t batch) {
  NumpyGenerator rng(o.seed);
  std::vector<std::vector<int64_t>> batches;
  if (o.steps == 0) {
    const int64_t used = o.max_examples ? std::min(o.max_examples, examples) : examples;
    for (int64_t e = 0; e < o.epochs; e++) {
      const auto order = rng.permutation(examples);
      for (int64_t start = 0; start + batch <= used; start += batch)
        batches.emplace_back(order.begin() + start, order.begin() + start + batch);
    }
    return batches;
  }
  auto order = rng.permutation(examples);
  int64_t start = 0;
  while (static_cast<int64_t>(batches.size()) < o.steps) {
    if (start + batch > examples) {
      order = rng.permutation(examples);
      start = 0;
    }
    batches.emplace_back(order.begin() + start, order.begin() + start + batch);
    std::sort(batches.back().begin(), batches.back().end());
    start += batch;
  }
  return batches;
}

Json run(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  PhasePeaks phases;
  const ArtifactSet set = open_artifact_set(o.artifacts, o.verify);
  LocalData data(o.data, set);
  if (!register_fixes())
    throw UserError("the ExecuTorch runtime beside this trainer lacks max_pool2d_with_indices_backward, which edgefl's "
                    "kernels correct; rebuild with 'edgefl-device build-native'");
  if (o.kernels == "edgefl" && !register_fast_kernels())
    throw UserError("--kernels edgefl: the ExecuTorch runtime beside this trainer lacks one of the operators edgefl's kernels "
                    "replace (bmm, mm, permute_copy, sum, mean, ...); "
                    "rebuild with 'edgefl-device build-native' or pass --kernels shipped");
  EtTrainer trainer(set, static_cast<int>(o.threads));
  if (data.examples() < trainer.batch())
    throw UserError("--data " + o.data + ": " + std::to_string(data.examples()) + " examples; the program trains "
                    "batches of exactly " + std::to_string(trainer.batch()) + ": give at least that many or export "
                    "the set with a smaller --batch-size");
  const int64_t loaded_rss = vm_status("VmRSS");
  phases.end("load");
  const int64_t eval_n = std::min(o.eval_examples, data.examples());
  Json before = eval_n ? evaluate(trainer, data, eval_n) : Json();

  const auto batches = schedule(o, data.examples(), trainer.batch());
  std::vector<double> losses;
  std::vector<unsigned char> x;
  std::vector<int64_t> y;
  const auto t1 = std::chrono::steady_clock::now();
  for (const auto& rows : batches) {
    data.gather(rows, x, y);
    losses.push_back(trainer.train_step(x, y, static_cast<float>(o.lr)));
  }
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  Json after = eval_n ? evaluate(trainer, data, eval_n) : Json();
  phases.end("train");

  std::vector<float> counters;
  const FloatPieces upload = trainer.upload(counters);
  size_t upload_values = 0;
  for (const auto& piece : upload) upload_values += piece.second;
  if (!o.out.empty()) {
    const std::string partial = o.out + ".partial";
    npy_write_f32(partial, upload);
    if (std::rename(partial.c_str(), o.out.c_str()) != 0) throw UserError(o.out + ": cannot write the upload there");
  }
  phases.end("upload");
  struct utsname host {};
  uname(&host);
  Json report = Json::object();
  report["trainer"] = "native";
  report["runtime"] = "executorch";
  report["version"] = EDGEFL_VERSION;
  report["machine"] = host.machine;
  report["config_hash"] = set.suffix.config_hash;
  report["artifact_id"] = set.suffix.id;
  report["steps"] = static_cast<int64_t>(losses.size());
  report["examples"] = o.steps == 0 && o.max_examples ? std::min(o.max_examples, data.examples()) : data.examples();
  report["batch_size"] = trainer.batch();
  report["data_read"] = "batch";  // LocalData reads the rows of each batch, nothing more
  report["lr"] = o.lr;
  report["loss_first"] = losses.empty() ? Json() : Json(losses.front());
  report["loss_last"] = losses.empty() ? Json() : Json(losses.back());
  report["loss_before"] = eval_n ? before["loss"] : Json();
  report["loss_after"] = eval_n ? after["loss"] : Json();
  report["accuracy_before"] = eval_n ? before["accuracy"] : Json();
  report["accuracy_after"] = eval_n ? after["accuracy"] : Json();
  if (o.losses) report["losses"] = losses;
  report["upload_bytes"] = static_cast<int64_t>(upload_values * 4);
  report["peak_rss_bytes"] = phases.whole;
  report["phase_peak_rss_bytes"] = phases.peaks;
  report["loaded_rss_bytes"] = loaded_rss;
  report["predicted_peak_bytes"] = set.suffix.predicted_peak;
  report["step_seconds"] = train_s / std::max<size_t>(losses.size(), 1);
  report["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report["threads"] = o.threads;
  report["kernels"] = o.kernels;
  report["cpu_level"] = EDGEFL_CPU_LEVEL;
  report["gemm_level"] = gemm_cpu_level();
  Json calls = Json::object();
  for (const auto& [name, n] : fast_kernel_calls()) calls[name] = n;
  report["edgefl_kernel_calls"] = calls;
  report["torch_loaded"] = false;
  return report;
}

}  // namespace
}  // namespace edgefl

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(edgefl::USAGE, stdout);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    // the level it was built for, and the one its products run here (AVX-512 where the CPU has it: gemm.cpp)
    std::printf("edgefl-et-train %s (%s, GEMM %s)\n", EDGEFL_VERSION, EDGEFL_CPU_LEVEL, edgefl::gemm_cpu_level());
    return 0;
  }
  try {
    const auto report = edgefl::run(edgefl::parse(argc, argv));
    std::printf("%s\n", report.dump(-1, ' ', false, edgefl::Json::error_handler_t::replace).c_str());
    return 0;
  } catch (const edgefl::UserError& e) {
    std::fprintf(stderr, "edgefl-et-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgefl-et-train: internal error: %s\n", e.what());
    return 1;
  }
}
