#include "outbox.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace edgefl::agent {

void Outbox::deliver(Upload& u) {
  u.attempts++;
  u.sent_at = now_s();
  u.wait_s = std::min(receipt_s_ * std::pow(2.0, u.attempts - 1), retry_max_s_);
  send_(u.messages);
}

void Outbox::post(Upload upload) {
  const std::string name = upload.name;
  waiting_[name] = std::move(upload);
  std::set<int64_t> rounds;
  for (const auto& kv : waiting_) rounds.insert(kv.second.round);
  while (rounds.size() > keep_rounds_) {     // a coordinator gone this long restarts the rounds it needs anyway
    const int64_t old = *rounds.begin();
    rounds.erase(rounds.begin());
    for (auto it = waiting_.begin(); it != waiting_.end();)
      if (it->second.round == old) {
        log_(EDGEFL_LOG_WARNING, "gave up the round-" + std::to_string(old) + " upload " + it->first +
                                     ": no receipt while " + std::to_string(keep_rounds_) + " later rounds came");
        it = waiting_.erase(it);
      } else {
        ++it;
      }
  }
  deliver(waiting_[name]);
}

void Outbox::append(const std::string& name, std::string topic, std::string payload) {
  Messages one{{std::move(topic), std::move(payload)}};
  send_(one);
  auto it = waiting_.find(name);
  if (it != waiting_.end()) it->second.messages.push_back(std::move(one.front()));
}

void Outbox::receipt(const std::string& name, bool taken, const std::string& reason) {
  auto it = waiting_.find(name);
  if (it == waiting_.end()) return;
  if (!taken)
    log_(EDGEFL_LOG_WARNING, "the coordinator refused the round-" + std::to_string(it->second.round) + " upload " +
                                 name + ": " + (reason.empty() ? "no reason given" : reason));
  waiting_.erase(it);
}

void Outbox::closed(int64_t round) {
  for (auto it = waiting_.begin(); it != waiting_.end();) it = it->second.round <= round ? waiting_.erase(it) : std::next(it);
}

const Upload* Outbox::for_round(int64_t round, const std::string& config_hash) const {
  for (const auto& kv : waiting_)
    if (kv.second.round == round && kv.second.config_hash == config_hash) return &kv.second;
  return nullptr;
}

int Outbox::resend(bool due_only) {
  const double now = now_s();
  std::vector<Upload*> due;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Upload& u = it->second;
    if (due_only && now - u.sent_at < u.wait_s) {
      ++it;
      continue;
    }
    if (u.attempts >= attempts_) {
      log_(EDGEFL_LOG_WARNING, "gave up the round-" + std::to_string(u.round) + " upload " + u.name + " after " +
                                   std::to_string(u.attempts) + " sends without a receipt");
      it = waiting_.erase(it);
      continue;
    }
    due.push_back(&u);
    ++it;
  }
  std::sort(due.begin(), due.end(), [](const Upload* a, const Upload* b) {
    return std::tie(a->round, a->sent_at) < std::tie(b->round, b->sent_at);
  });
  for (Upload* u : due) deliver(*u);
  return static_cast<int>(due.size());
}

}  // namespace edgefl::agent
