// A device's end of the protocol over one MqttWire (device_runtime/link.py): presence, instructions in arrival
// order, the coordinator's round notices (work of a round that is over is dropped), receipts for the outbox,
// and the bytes each round downloaded. Everything runs on the agent's one thread: `pump` takes the next event
// from the wire, handles what the link owns and hands a fetch what is its own (its file's manifest and
// chunks, a reconnect, a wake-up).
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cache.h"
#include "events.h"
#include "mqtt_wire.h"
#include "outbox.h"
#include "parse.h"

namespace edgefl::agent {

// One instruction as it arrived: one it can follow, or one it answers with a refusal.
struct Job {
  std::optional<Instruction> instruction;
  std::optional<Unreadable> unreadable;
  int64_t round() const { return instruction ? instruction->round : unreadable->round; }
};

struct LinkOptions {
  WireOptions wire;
  std::string device_id, cache_dir;
  int64_t cache_budget_bytes = 128ll << 20;
  double receipt_s = 30;
};

class Link {
 public:
  Link(const LinkOptions& options, LogFn log);
  void announce(const std::string& profile_json);
  std::optional<Job> next_instruction(double timeout_s);
  // Why work on `round` is over (a newer round began, the coordinator closed it), or nothing.
  std::optional<std::string> superseded(int64_t round) const;
  bool answered(const Instruction& instruction);
  // The next event a fetch (of `fetching`, "" for none) must see, after the link handled the rest.
  std::optional<Event> pump(double timeout_s, const std::string& fetching = "");
  void report(Upload upload);
  void report_more(const std::string& name, std::string topic, std::string payload) {
    outbox_.append(name, std::move(topic), std::move(payload));
  }
  bool flush(double timeout_s);        // the broker acknowledged every publish (events handled meanwhile)
  Traffic downloaded(int64_t round);   // bytes received since this round's instruction arrived
  void stop();
  bool stopping() const { return stopping_; }
  void close();
  MqttWire& wire() { return *wire_; }
  ArtifactCache& cache() { return cache_; }
  const std::string& device_id() const { return device_id_; }
  int64_t working = 0;                 // the round of the instruction being worked on
  int64_t stale_chunks = 0;

 private:
  void send(const Messages& messages);
  void on_message(const Event& e);
  void on_instruction(const Event& e);

  LogFn log_;
  std::string device_id_;
  EventQueue events_;
  std::unique_ptr<MqttWire> wire_;
  ArtifactCache cache_;
  Outbox outbox_;
  std::deque<Job> jobs_;
  std::map<int64_t, Traffic> marks_;
  std::optional<std::pair<int64_t, bool>> notice_;   // the coordinator's last word: (round, open)
  int64_t newest_ = 0;
  std::string profile_;
  std::atomic<bool> stopping_{false};
  bool closed_ = false;
};

}  // namespace edgefl::agent
