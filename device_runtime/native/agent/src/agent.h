// The device agent's round loop (device_runtime/agent.py): for each instruction, refuse what this device
// cannot take (a predicted peak over its memory, no artifact set, another runtime), fetch the set, train it in
// a fresh child (the native trainer), and report what it really used: the child's peak (its own VmHWM and the
// kernel's ru_maxrss), wall time, energy with its source, the cache's size, the bytes the round downloaded, and
// this agent's own peak and idle RSS beside the child's. Work of a round that is over is dropped unreported;
// an instruction already answered is answered again with the same upload.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "fetch.h"
#include "link.h"

namespace edgefl::agent {

struct AgentConfig {
  std::string device_id, data, runtime = "executorch", trainer, profile, energy = "auto";
  int64_t memory_bytes = 0;      // 0: not declared
  double power_w = 0, fetch_timeout_s = 600;
  int threads = 1, rounds = 0, i2c_bus = -1;   // i2c_bus: an INA219's (-1: none)
  bool enforce_memory = false;
};

class Agent {
 public:
  Agent(AgentConfig config, Link& link, LogFn log);
  std::string profile_json() const;   // what the device announces with its presence
  int serve();                        // rounds reported

 private:
  struct Outcome;
  bool handle(const Job& job, Outcome& out);
  void send_report(Outcome& out);
  AgentConfig c_;
  Link& link_;
  LogFn log_;
  Fetcher fetcher_;
  int64_t idle_rss_ = 0;
};

}  // namespace edgefl::agent
