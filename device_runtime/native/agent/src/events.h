// What the MQTT client's threads hand the agent's one thread: messages as they arrive, a reconnect, a wake-up
// (stop, news for a fetch). A bounded wait on this queue is the agent's only blocking point, so stopping and
// round notices reach a fetch or a training at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

namespace edgefl::agent {

struct Event {
  enum Kind { MESSAGE, RECONNECTED, WAKE } kind = WAKE;
  std::string topic, payload;
  int64_t wire_bytes = 0;
};

class EventQueue {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(e));
    }
    ready_.notify_one();
  }
  // The next event, or nothing after `timeout_s`.
  std::optional<Event> pop(double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0),
                         [&] { return !events_.empty(); }))
      return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
};

}  // namespace edgefl::agent
