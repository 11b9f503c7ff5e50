// One MQTT connection as the protocol uses it (edgefl/protocol/mqtt_wire.py): paho.mqtt.c's asynchronous
// client speaking MQTT 5 with a persistent session (clean start off, session expiry one day), a retained last
// will, QoS 1 for everything, the broker's packet limit (from its CONNACK) checked before each publish, and
// reconnects by itself (1 s doubling to 8 s). What arrives goes to the agent's EventQueue; every PUBLISH is
// counted in payload and wire bytes (the MQTT 5 PUBLISH packet as framed), as the Python wire counts them.
#pragma once

#include <MQTTAsync.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "events.h"
#include "util.h"

namespace edgefl::agent {

struct Traffic {
  int64_t messages = 0, payload_bytes = 0, wire_bytes = 0;
  Traffic since(const Traffic& e) const {
    return {messages - e.messages, payload_bytes - e.payload_bytes, wire_bytes - e.wire_bytes};
  }
};

int64_t publish_packet_bytes(const std::string& topic, int64_t payload_bytes, int qos = 1, int64_t properties_bytes = 1);

struct WireOptions {
  std::string url, client_id, ca_file, will_topic, will_payload;
  std::optional<std::pair<std::string, std::string>> login;   // username, password
  int session_expiry_s = 86400, keepalive_s = 30;
  double connect_timeout_s = 10;
};

class MqttWire {
 public:
  // Connects (UserError naming what is wrong: the login, the URL, TLS, a broker that is not there).
  MqttWire(const WireOptions& options, EventQueue& events, LogFn log);
  ~MqttWire();
  MqttWire(const MqttWire&) = delete;
  MqttWire& operator=(const MqttWire&) = delete;

  void subscribe(const std::vector<std::string>& filters, double timeout_s = 10);  // waits for the SUBACK
  void unsubscribe(const std::vector<std::string>& filters);
  // QoS 1; false (and logged) when the packet is over the broker's limit or the client refuses it.
  bool publish(const std::string& topic, const std::string& payload, bool retain = false);
  // Publish and wait for the PUBACK: nullopt when taken, else why refused; "" in `why` ... see .cpp
  std::optional<std::string> confirm(const std::string& topic, const std::string& payload, double timeout_s = 10);
  bool flush(double timeout_s);      // every publish acknowledged
  bool connected() const { return up_; }
  void close(double timeout_s = 5);  // flush, DISCONNECT (no will)
  Traffic sent() const;
  Traffic received() const;
  int64_t max_packet_size() const { return max_packet_; }
  const std::string& url() const { return url_; }

 private:
  struct Op;
  static void on_published(void* context, MQTTAsync_successData5* response);
  static void on_publish_failed(void* context, MQTTAsync_failureData5* response);
  static void on_connected(void* context, char* cause);
  static void on_lost(void* context, char* cause);
  static int on_message(void* context, char* topic, int topic_len, MQTTAsync_message* message);
  void finish(Op* op, bool ok, int reason);
  bool check_size(const std::string& topic, size_t payload_bytes);
  // MQTTAsync_send at QoS 1 with `op` as the callbacks' context, counted in flight; on failure (no callback
  // will come) uncounted and `op` freed. MQTTAsync's code.
  int send(Op* op, const std::string& topic, const std::string& payload, bool retain);

  EventQueue& events_;
  LogFn log_;
  std::string url_, client_id_;
  MQTTAsync client_ = nullptr;
  std::atomic<bool> up_{false}, closing_{false};
  std::atomic<int64_t> max_packet_{268435460};
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int inflight_ = 0;
  Traffic sent_, received_;
  std::vector<std::string> filters_;
  // the first connect's outcome
  bool answered_ = false, accepted_ = false;
  int connect_code_ = 0, connect_reason_ = 0;
  std::string connect_message_;
  bool suback_ = false;
  std::string suback_refusal_;
};

}  // namespace edgefl::agent
