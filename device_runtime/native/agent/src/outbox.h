// A device's uploads kept until the coordinator's receipt (device protocol rule 5; device_runtime/outbox.py):
// sent again, whole and under the same name, when the connection comes back and when no receipt came within
// receipt_s, then twice that, up to 300 s, at most 10 times; forgotten on its receipt, when its round is
// announced closed, or when uploads of 4 later rounds wait.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "util.h"

namespace edgefl::agent {

using Messages = std::vector<std::pair<std::string, std::string>>;   // (topic, payload): chunks, then the meta

struct Upload {
  int64_t round = 0;
  std::string name, config_hash;
  Messages messages;
  double sent_at = 0, wait_s = 0;
  int attempts = 0;
};

class Outbox {
 public:
  Outbox(std::function<void(const Messages&)> send, double receipt_s, LogFn log, double retry_max_s = 300,
         int attempts = 10, size_t keep_rounds = 4)
      : send_(std::move(send)), log_(std::move(log)), receipt_s_(receipt_s), retry_max_s_(retry_max_s),
        attempts_(attempts), keep_rounds_(keep_rounds) {}
  void post(Upload upload);
  // One more message of a waiting upload (its meta, written once its chunks are out), sent and kept with it.
  void append(const std::string& name, std::string topic, std::string payload);
  void receipt(const std::string& name, bool taken, const std::string& reason);
  void closed(int64_t round);
  const Upload* for_round(int64_t round, const std::string& config_hash) const;
  int resend(bool due_only = true);
  size_t waiting() const { return waiting_.size(); }

 private:
  void deliver(Upload& u);
  std::function<void(const Messages&)> send_;
  LogFn log_;
  double receipt_s_, retry_max_s_;
  int attempts_;
  size_t keep_rounds_;
  std::map<std::string, Upload> waiting_;
};

}  // namespace edgefl::agent
