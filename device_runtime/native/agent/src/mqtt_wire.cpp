#include "mqtt_wire.h"

#include <algorithm>
#include <cstring>

namespace edgefl::agent {
namespace {

int varint_len(int64_t n) { return n < 128 ? 1 : n < 16384 ? 2 : n < 2097152 ? 3 : 4; }

// mqtt://host:port -> tcp://host:port, mqtts:// -> ssl:// (paho's names); UserError for anything else.
std::string paho_uri(const std::string& url, bool& tls) {
  const auto scheme = url.find("://");
  const std::string s = scheme == std::string::npos ? "" : url.substr(0, scheme);
  if ((s != "mqtt" && s != "mqtts") || url.size() <= scheme + 3)
    throw UserError("--broker " + url + ": expected mqtt://HOST:PORT or mqtts://HOST:PORT");
  tls = s == "mqtts";
  std::string rest = url.substr(scheme + 3);
  if (rest.find(':') == std::string::npos) rest += tls ? ":8883" : ":1883";
  return (tls ? "ssl://" : "tcp://") + rest;
}

}  // namespace

int64_t publish_packet_bytes(const std::string& topic, int64_t payload_bytes, int qos, int64_t properties_bytes) {
  const int64_t remaining = 2 + static_cast<int64_t>(topic.size()) + (qos ? 2 : 0) + properties_bytes + payload_bytes;
  return 1 + varint_len(remaining) + remaining;
}

// One publish's callback context: which wire, which topic (for a refusal's log), and a waiter for confirm().
struct MqttWire::Op {
  MqttWire* wire;
  std::string topic;
  bool watched = false, done = false;
  int reason = 0;
};

MqttWire::MqttWire(const WireOptions& o, EventQueue& events, LogFn log)
    : events_(events), log_(std::move(log)), url_(o.url), client_id_(o.client_id) {
  bool tls = false;
  const std::string uri = paho_uri(o.url, tls);
  // OpenSSL (3.x) initialises itself when TLS is first used; paho's own init loads every error string and
  // algorithm at start, which costs ~2 MiB of resident memory a plain mqtt:// device never needs
  static const bool openssl_left_alone = [] {
    MQTTAsync_init_options init = MQTTAsync_init_options_initializer;
    init.do_openssl_init = 0;
    MQTTAsync_global_init(&init);
    return true;
  }();
  (void)openssl_left_alone;
  MQTTAsync_createOptions create = MQTTAsync_createOptions_initializer5;
  // what is published while the connection is down waits in the client, bounded (the outbox resends reports)
  create.sendWhileDisconnected = 1;
  create.maxBufferedMessages = 1000;
  create.deleteOldestMessages = 1;
  if (MQTTAsync_createWithOptions(&client_, uri.c_str(), o.client_id.c_str(), MQTTCLIENT_PERSISTENCE_NONE, nullptr,
                                  &create) != MQTTASYNC_SUCCESS)
    throw UserError("--broker " + o.url + ": the MQTT client cannot use this address");
  MQTTAsync_setCallbacks(client_, this, &MqttWire::on_lost, &MqttWire::on_message, nullptr);
  MQTTAsync_setConnected(client_, this, &MqttWire::on_connected);

  MQTTAsync_connectOptions c = MQTTAsync_connectOptions_initializer5;
  MQTTProperties props = MQTTProperties_initializer;
  MQTTProperty expiry;
  expiry.identifier = MQTTPROPERTY_CODE_SESSION_EXPIRY_INTERVAL;
  expiry.value.integer4 = static_cast<unsigned>(o.session_expiry_s);
  MQTTProperties_add(&props, &expiry);
  c.cleanstart = 0;
  c.connectProperties = &props;
  c.keepAliveInterval = o.keepalive_s;
  c.connectTimeout = static_cast<int>(o.connect_timeout_s);
  c.automaticReconnect = 1;
  c.minRetryInterval = 1;
  c.maxRetryInterval = 8;
  MQTTAsync_willOptions will = MQTTAsync_willOptions_initializer;
  if (!o.will_topic.empty()) {
    will.topicName = o.will_topic.c_str();
    will.payload.data = o.will_payload.data();
    will.payload.len = static_cast<int>(o.will_payload.size());
    will.qos = 1;
    will.retained = 1;
    c.will = &will;
  }
  MQTTAsync_SSLOptions ssl = MQTTAsync_SSLOptions_initializer;
  if (tls) {
    if (!o.ca_file.empty()) ssl.trustStore = o.ca_file.c_str();
    ssl.enableServerCertAuth = 1;
    ssl.verify = 1;
    c.ssl = &ssl;
  }
  if (o.login) {
    c.username = o.login->first.c_str();
    c.password = o.login->second.c_str();
  }
  c.context = this;
  c.onSuccess5 = [](void* ctx, MQTTAsync_successData5* r) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    const int limit = MQTTProperties_getNumericValue(&r->properties, MQTTPROPERTY_CODE_MAXIMUM_PACKET_SIZE);
    if (limit > 0) w->max_packet_ = std::min<int64_t>(w->max_packet_, limit);
    w->answered_ = w->accepted_ = true;
    w->up_ = true;
    w->changed_.notify_all();
  };
  c.onFailure5 = [](void* ctx, MQTTAsync_failureData5* r) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->answered_ = true;
    w->connect_code_ = r ? r->code : -1;
    w->connect_reason_ = r ? r->reasonCode : 0;
    w->connect_message_ = r && r->message ? r->message : "";
    w->changed_.notify_all();
  };
  const int rc = MQTTAsync_connect(client_, &c);
  MQTTProperties_free(&props);
  std::unique_lock<std::mutex> lock(mutex_);
  const bool answered = rc == MQTTASYNC_SUCCESS &&
      changed_.wait_for(lock, std::chrono::duration<double>(o.connect_timeout_s + 1), [&] { return answered_; });
  if (accepted_) return;
  lock.unlock();
  MQTTAsync_destroy(&client_);
  const std::string who = "the broker at " + o.url;
  // the CONNACK's refusal: paho hands it as the reason code or, depending on the path, as a positive `code`
  // (MQTT 5 reason codes, or 3.1.1's 4 bad login / 5 not authorised)
  if (answered && connect_reason_ < 0x80 && connect_code_ > 0)
    connect_reason_ = connect_code_ == 4 ? 0x86 : connect_code_ == 5 ? 0x87 : connect_code_;
  if (answered && (connect_reason_ == MQTTREASONCODE_BAD_USER_NAME_OR_PASSWORD ||
                   connect_reason_ == MQTTREASONCODE_NOT_AUTHORIZED || connect_reason_ == MQTTREASONCODE_CLIENT_IDENTIFIER_NOT_VALID))
    throw UserError(who + " did not accept '" + o.client_id + "': " +
                    MQTTReasonCode_toString(static_cast<MQTTReasonCodes>(connect_reason_)) + "; check --credentials (" +
                    (o.login ? "the login of " + o.login->first : std::string("none given: anonymous")) +
                    "): give credentials/" + o.client_id + ".json from 'edgefl broker config'");
  if (answered && connect_reason_ >= 0x80)
    throw UserError(who + " refused '" + o.client_id + "': " +
                    MQTTReasonCode_toString(static_cast<MQTTReasonCodes>(connect_reason_)));
  std::string why = connect_message_.empty() ? (answered ? MQTTAsync_strerror(connect_code_) : "no answer within " +
                                                std::to_string(static_cast<int>(o.connect_timeout_s)) + " s")
                                             : connect_message_;
  throw UserError("cannot connect to " + who + ": " + why +
                  (tls ? "; is it a TLS listener, and does --ca-file hold the CA that signed its certificate?"
                       : "; is it running, and is the URL (mqtt:// or mqtts://, port) right?"));
}

MqttWire::~MqttWire() {
  if (client_ != nullptr) MQTTAsync_destroy(&client_);
}

void MqttWire::on_connected(void* context, char* cause) {
  auto* w = static_cast<MqttWire*>(context);
  // paho says why: the first connect ("connect onSuccess called") or its own reconnect ("automatic reconnect")
  const bool again = cause != nullptr && std::strstr(cause, "automatic") != nullptr;
  std::vector<std::string> filters;
  {
    std::lock_guard<std::mutex> lock(w->mutex_);
    filters = w->filters_;
  }
  w->up_ = true;
  if (!again) return;
  if (!filters.empty()) {  // the session should keep them; a broker that lost its state does not
    std::vector<char*> names;
    std::vector<int> qos(filters.size(), 1);
    for (auto& f : filters) names.push_back(&f[0]);
    MQTTAsync_responseOptions r = MQTTAsync_responseOptions_initializer;
    MQTTAsync_subscribeMany(w->client_, static_cast<int>(names.size()), names.data(), qos.data(), &r);
  }
  w->log_(EDGEFL_LOG_INFO, "connected again to " + w->url_);
  Event e;
  e.kind = Event::RECONNECTED;
  w->events_.push(std::move(e));
}

void MqttWire::on_lost(void* context, char* cause) {
  auto* w = static_cast<MqttWire*>(context);
  w->up_ = false;
  if (!w->closing_)
    w->log_(EDGEFL_LOG_WARNING, "connection to " + w->url_ + " lost (" + (cause ? cause : "no reason given") +
                                    "); reconnecting");
}

int MqttWire::on_message(void* context, char* topic, int topic_len, MQTTAsync_message* m) {
  auto* w = static_cast<MqttWire*>(context);
  Event e;
  e.kind = Event::MESSAGE;
  e.topic = topic_len > 0 ? std::string(topic, static_cast<size_t>(topic_len)) : std::string(topic);
  e.payload.assign(static_cast<const char*>(m->payload), static_cast<size_t>(m->payloadlen));
  const int64_t props = m->properties.length + varint_len(m->properties.length);   // the length varint included
  e.wire_bytes = publish_packet_bytes(e.topic, m->payloadlen, m->qos, props);
  {
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->received_.messages++;
    w->received_.payload_bytes += m->payloadlen;
    w->received_.wire_bytes += e.wire_bytes;
  }
  MQTTAsync_freeMessage(&m);
  MQTTAsync_free(topic);
  w->events_.push(std::move(e));
  return 1;
}

void MqttWire::finish(Op* op, bool ok, int reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  inflight_--;
  if (!ok && !op->watched)
    log_(EDGEFL_LOG_WARNING, "the broker at " + url_ + " refused a publish on " + op->topic + ": " +
                                 MQTTReasonCode_toString(static_cast<MQTTReasonCodes>(reason)));
  if (op->watched) {
    op->done = true;
    op->reason = ok ? 0 : (reason ? reason : 0x80);
  } else {
    delete op;
  }
  changed_.notify_all();
}

void MqttWire::on_published(void* context, MQTTAsync_successData5* r) {
  auto* op = static_cast<Op*>(context);
  const int reason = r ? r->reasonCode : 0;
  op->wire->finish(op, reason < 0x80, reason);
}

void MqttWire::on_publish_failed(void* context, MQTTAsync_failureData5* r) {
  auto* op = static_cast<Op*>(context);
  op->wire->finish(op, false, r ? r->reasonCode : 0x80);
}

bool MqttWire::check_size(const std::string& topic, size_t payload_bytes) {
  const int64_t size = publish_packet_bytes(topic, static_cast<int64_t>(payload_bytes));
  if (size <= max_packet_) return true;
  log_(EDGEFL_LOG_ERROR, topic + ": a " + std::to_string(size) + " B packet exceeds the broker's max_packet_size of " +
                             std::to_string(max_packet_.load()) + " B; not sent (raise max_packet_size in the broker config)");
  return false;
}

int MqttWire::send(Op* op, const std::string& topic, const std::string& payload, bool retain) {
  MQTTAsync_responseOptions r = MQTTAsync_responseOptions_initializer;
  r.context = op;
  r.onSuccess5 = &MqttWire::on_published;
  r.onFailure5 = &MqttWire::on_publish_failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inflight_++;
  }
  const int rc = MQTTAsync_send(client_, topic.c_str(), static_cast<int>(payload.size()), payload.data(), 1,
                                retain ? 1 : 0, &r);
  if (rc != MQTTASYNC_SUCCESS) {     // no callback will come for it
    std::lock_guard<std::mutex> lock(mutex_);
    inflight_--;
    delete op;
  }
  return rc;
}

bool MqttWire::publish(const std::string& topic, const std::string& payload, bool retain) {
  if (!check_size(topic, payload.size())) return false;
  const int rc = send(new Op{this, topic}, topic, payload, retain);
  if (rc != MQTTASYNC_SUCCESS) {
    log_(EDGEFL_LOG_WARNING, "not sent on " + topic + ": " + MQTTAsync_strerror(rc) + "; sent again later");
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  sent_.messages++;
  sent_.payload_bytes += static_cast<int64_t>(payload.size());
  sent_.wire_bytes += publish_packet_bytes(topic, static_cast<int64_t>(payload.size()));
  return true;
}

std::optional<std::string> MqttWire::confirm(const std::string& topic, const std::string& payload, double timeout_s) {
  auto* op = new Op{this, topic, true};
  if (send(op, topic, payload, false) != MQTTASYNC_SUCCESS) return std::string("the client could not send it");
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return op->done; })) {
    op->watched = false;   // its late answer frees it
    return std::string("no PUBACK within " + std::to_string(static_cast<int>(timeout_s)) + " s");
  }
  const int reason = op->reason;
  delete op;
  if (reason == 0) return std::nullopt;
  return std::string(MQTTReasonCode_toString(static_cast<MQTTReasonCodes>(reason)));
}

void MqttWire::subscribe(const std::vector<std::string>& filters, double timeout_s) {
  std::vector<std::string> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& f : filters)
      if (std::find(filters_.begin(), filters_.end(), f) == filters_.end()) fresh.push_back(f), filters_.push_back(f);
    suback_ = false;
    suback_refusal_.clear();
  }
  if (fresh.empty()) return;
  std::vector<char*> names;
  std::vector<int> qos(fresh.size(), 1);
  for (auto& f : fresh) names.push_back(&f[0]);
  MQTTAsync_responseOptions r = MQTTAsync_responseOptions_initializer;
  r.context = this;
  r.onSuccess5 = [](void* ctx, MQTTAsync_successData5* d) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->suback_ = true;
    if (d && d->alt.sub.reasonCodeCount > 0)
      for (int i = 0; i < d->alt.sub.reasonCodeCount; i++)
        if (d->alt.sub.reasonCodes[i] >= 0x80) w->suback_refusal_ = MQTTReasonCode_toString(d->alt.sub.reasonCodes[i]);
    if (d && d->alt.sub.reasonCodeCount == 0 && d->reasonCode >= 0x80)
      w->suback_refusal_ = MQTTReasonCode_toString(d->reasonCode);
    w->changed_.notify_all();
  };
  r.onFailure5 = [](void* ctx, MQTTAsync_failureData5* d) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->suback_ = true;
    w->suback_refusal_ = d && d->reasonCode ? MQTTReasonCode_toString(d->reasonCode) : "refused";
    w->changed_.notify_all();
  };
  const int rc = MQTTAsync_subscribeMany(client_, static_cast<int>(names.size()), names.data(), qos.data(), &r);
  std::unique_lock<std::mutex> lock(mutex_);
  const bool granted = rc == MQTTASYNC_SUCCESS &&
      changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return suback_; });
  if (!granted || !suback_refusal_.empty())
    log_(EDGEFL_LOG_WARNING, "the broker at " + url_ + " did not grant " + fresh.front() + " (" +
                                 (suback_refusal_.empty() ? std::string("no SUBACK") : suback_refusal_) + ")");
}

void MqttWire::unsubscribe(const std::vector<std::string>& filters) {
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& f : filters) {
      auto it = std::find(filters_.begin(), filters_.end(), f);
      if (it != filters_.end()) filters_.erase(it), gone.push_back(f);
    }
  }
  if (gone.empty() || !up_) return;
  std::vector<char*> names;
  for (auto& f : gone) names.push_back(&f[0]);
  MQTTAsync_responseOptions r = MQTTAsync_responseOptions_initializer;
  MQTTAsync_unsubscribeMany(client_, static_cast<int>(names.size()), names.data(), &r);
}

bool MqttWire::flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return inflight_ <= 0; });
}

void MqttWire::close(double timeout_s) {
  if (up_) flush(timeout_s);
  closing_ = true;
  MQTTAsync_disconnectOptions d = MQTTAsync_disconnectOptions_initializer5;
  d.timeout = static_cast<int>(timeout_s * 1000);
  d.context = this;
  d.onSuccess5 = [](void* ctx, MQTTAsync_successData5*) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->up_ = false;
    w->changed_.notify_all();
  };
  d.onFailure5 = [](void* ctx, MQTTAsync_failureData5*) {
    auto* w = static_cast<MqttWire*>(ctx);
    std::lock_guard<std::mutex> lock(w->mutex_);
    w->up_ = false;
    w->changed_.notify_all();
  };
  if (MQTTAsync_disconnect(client_, &d) == MQTTASYNC_SUCCESS) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !up_; });
  }
  up_ = false;
}

Traffic MqttWire::sent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sent_;
}

Traffic MqttWire::received() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return received_;
}

}  // namespace edgefl::agent
