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

// Payload bytes waiting are bounded: a group's retained chunks all arrive at once on subscribing, and held here
// they would cost the whole file in memory. The MQTT client's thread waits (up to `max_wait_s`, so a busy agent
// never stalls the connection for long) while more than `max_bytes` wait; TCP holds the rest back meanwhile.
class EventQueue {
 public:
  explicit EventQueue(size_t max_bytes = 2u << 20, double max_wait_s = 2) : max_bytes_(max_bytes), max_wait_s_(max_wait_s) {}
  void push(Event e) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!e.payload.empty())
        room_.wait_for(lock, std::chrono::duration<double>(max_wait_s_), [&] { return bytes_ <= max_bytes_; });
      bytes_ += e.payload.size();
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
    bytes_ -= e.payload.size();
    room_.notify_all();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<Event> events_;
  size_t bytes_ = 0, max_bytes_;
  double max_wait_s_;
};

}  // namespace edgefl::agent
