#include "link.h"

#include <nlohmann/json.hpp>

namespace edgefl::agent {

namespace topic {
std::string dev(const std::string& d) { return "fl/v1/dev/" + d; }
}  // namespace topic

Link::Link(const LinkOptions& o, LogFn log)
    : log_(std::move(log)), device_id_(o.device_id),
      cache_(o.cache_dir, o.cache_budget_bytes),
      outbox_([this](const Messages& m) { send(m); }, o.receipt_s, log_) {
  wire_ = std::make_unique<MqttWire>(o.wire, events_, log_);
  wire_->subscribe({topic::dev(device_id_) + "/down/#", "fl/v1/broadcast/#"});
  // a login's first publish says whether the broker's ACL lets it write on its own up/ (MQTT 5 PUBACK)
  const auto refusal = wire_->confirm(topic::dev(device_id_) + "/up/hello",
                                      nlohmann::json{{"device", device_id_}}.dump());
  if (refusal) {
    wire_->close(1);
    throw UserError(device_id_ + ": the broker at " + o.wire.url + " refused its publish on its own up/ topic (" +
                    *refusal + "): " + (o.wire.login ? "--credentials is not " + device_id_ + "'s login"
                                                     : std::string("no --credentials (anonymous)")) +
                    ", so nobody would hear it; give credentials/" + device_id_ + ".json from 'edgefl broker config'");
  }
}

void Link::announce(const std::string& profile_json) {
  profile_ = profile_json;
  const auto profile = nlohmann::json::parse(profile_json);
  wire_->publish("fl/v1/presence/" + device_id_,
                 nlohmann::json{{"online", true}, {"device", device_id_}, {"profile", profile}}.dump(), true);
}

void Link::send(const Messages& messages) {
  if (!wire_->connected()) return;     // sent again when the connection is back (the outbox keeps it)
  for (const auto& [t, payload] : messages) wire_->publish(t, payload);
}

std::optional<Event> Link::pump(double timeout_s, const std::string& fetching) {
  auto e = events_.pop(timeout_s);
  if (!e) return std::nullopt;
  if (e->kind == Event::RECONNECTED) {
    if (!profile_.empty()) announce(profile_);   // the will marked this device offline meanwhile
    outbox_.resend(false);                        // a restarted broker may have lost them
    return e;
  }
  if (e->kind == Event::WAKE) return e;
  Topic t;
  if (!parse_topic(e->topic, t)) return std::nullopt;
  if (t.kind == "manifest" || t.kind == "chunk") {
    if (!fetching.empty() && t.sha == fetching) return e;
    stale_chunks += t.kind == "chunk";
    return std::nullopt;
  }
  on_message(*e);
  Event wake;          // news a fetch or a training checks (a newer round, a closed one)
  wake.kind = Event::WAKE;
  return wake;
}

void Link::on_message(const Event& e) {
  Topic t;
  parse_topic(e.topic, t);
  std::string why;
  if (t.kind == "instr") {
    on_instruction(e);
  } else if (t.kind == "receipt") {
    Receipt r;
    if (parse_receipt(e.payload, r, why)) outbox_.receipt(r.upload, r.taken, r.reason);
    else log_(EDGEFL_LOG_WARNING, "an unreadable receipt: " + why);
  } else if (t.kind == "broadcast" && !e.payload.empty()) {
    int64_t round = 0;
    bool open = false;
    if (!parse_round_notice(e.payload, round, open, why)) return;
    notice_ = std::make_pair(round, open);
    newest_ = round;     // the coordinator's word counts: a new run starts its rounds again at 1
    if (!open) outbox_.closed(round);
  }
}

void Link::on_instruction(const Event& e) {
  Job job;
  Instruction ins;
  std::string why;
  std::optional<Unreadable> unreadable;
  if (!parse_instruction(e.payload, ins, why, &unreadable)) {
    log_(EDGEFL_LOG_WARNING, "refused an instruction: " + why);
    if (unreadable) {             // answered with a failed report and the reason
      job.unreadable = unreadable;
      jobs_.push_back(job);
    }
    return;
  }
  if (ins.device_id != device_id_) {
    log_(EDGEFL_LOG_WARNING, "dropped an instruction addressed to " + ins.device_id);
    return;
  }
  const Traffic before = wire_->received();
  marks_[ins.round] = Traffic{before.messages - 1, before.payload_bytes - static_cast<int64_t>(e.payload.size()),
                              before.wire_bytes - e.wire_bytes};
  newest_ = std::max(newest_, ins.round);
  job.instruction = std::move(ins);
  jobs_.push_back(std::move(job));
}

std::optional<Job> Link::next_instruction(double timeout_s) {
  outbox_.resend();
  const double until = now_s() + timeout_s;
  while (jobs_.empty() && !stopping_) {
    const double left = until - now_s();
    if (left <= 0) return std::nullopt;
    pump(left);
  }
  if (stopping_ || jobs_.empty()) return std::nullopt;
  Job job = std::move(jobs_.front());
  jobs_.pop_front();
  if (job.instruction) working = job.instruction->round;
  return job;
}

std::optional<std::string> Link::superseded(int64_t round) const {
  if (!round) return std::nullopt;
  if (newest_ > round)
    return "round " + std::to_string(newest_) + " began; round " + std::to_string(round) + " is over";
  if (notice_ && (notice_->first > round || (notice_->first == round && !notice_->second)))
    return "the coordinator closed round " + std::to_string(round);
  return std::nullopt;
}

bool Link::answered(const Instruction& ins) {
  const Upload* u = outbox_.for_round(ins.round, ins.config_hash);
  if (u == nullptr) return false;
  log_(EDGEFL_LOG_INFO, "round " + std::to_string(ins.round) + " was answered already (upload " + u->name +
                            "): sending the answer again");
  send(u->messages);
  return true;
}

Traffic Link::downloaded(int64_t round) {
  auto it = marks_.find(round);
  if (it == marks_.end()) return Traffic{};
  const Traffic t = wire_->received().since(it->second);
  marks_.erase(it);
  return t;
}

void Link::report(Upload upload) { outbox_.post(std::move(upload)); }

bool Link::flush(double timeout_s) {
  const double until = now_s() + timeout_s;
  while (!wire_->flush(0.05)) {      // PUBACKs come through the same client thread that fills the event queue
    if (now_s() >= until) return false;
    while (pump(0)) {
    }
  }
  return true;
}

void Link::stop() {
  stopping_ = true;
  Event e;
  e.kind = Event::WAKE;
  events_.push(std::move(e));
}

void Link::close() {
  if (closed_) return;
  closed_ = true;
  if (!profile_.empty() && wire_->connected())
    wire_->publish("fl/v1/presence/" + device_id_,
                   nlohmann::json{{"online", false}, {"device", device_id_}, {"profile", nlohmann::json::object()},
                                  {"reason", "it stopped"}}.dump(), true);
  wire_->close(5);
}

}  // namespace edgefl::agent
