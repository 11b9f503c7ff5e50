// The parsers of parse.h. nlohmann::json with exceptions turned into `why`: a malformed message is one line
// in the log (or a refusal the coordinator reads), never a crash of the agent.
#include "parse.h"

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace edgefl::agent {
namespace {

using nlohmann::json;

bool parse_object(std::string_view payload, json& out, const char* what, std::string& why) {
  out = json::parse(payload.begin(), payload.end(), nullptr, false);
  if (out.is_discarded() || !out.is_object()) {
    why = std::string(what) + ": not a JSON object";
    return false;
  }
  return true;
}

bool hex_of(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// An integer JSON value (a float with an integral value is one too, as Python's int() takes it).
int64_t integer(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw std::invalid_argument("expected an integer, got " + v.dump().substr(0, 40) + " (too large)");
  if (v.is_number_integer()) return v.get<int64_t>();
  // a float converts only where int64 holds it (outside, the conversion is undefined: found by fuzzing)
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= -9.2e18 && d <= 9.2e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  throw std::invalid_argument("expected an integer, got " + v.dump().substr(0, 40));
}

bool group_name_ok(const std::string& g) {
  if (g.empty() || g.size() > 4096) return false;
  for (unsigned char c : g)
    if (c <= 0x20 || c == 0x7f || std::string_view("/+#:$").find(static_cast<char>(c)) != std::string_view::npos)
      return false;
  return true;
}

}  // namespace

bool is_sha256(std::string_view s) { return hex_of(s, 64); }
bool is_upload_id(std::string_view s) { return hex_of(s, 16); }

bool parse_instruction(std::string_view payload, Instruction& out, std::string& why,
                       std::optional<Unreadable>* unreadable) {
  json d;
  if (!parse_object(payload, d, "instruction", why)) return false;
  const auto answerable = [&](const std::string& reason) {
    why = reason;
    if (unreadable == nullptr) return false;
    try {   // enough to answer with a failed report (envelopes.Unreadable.of)
      const json& ins = d.at("instruction");
      Unreadable u;
      u.round = integer(ins.at("round"));
      if (ins.contains("config_hash") && ins["config_hash"].is_string()) u.config_hash = ins["config_hash"];
      u.reason = reason;
      *unreadable = u;
    } catch (const std::exception&) {
    }
    return false;
  };
  const json schema = d.value("schema", json());
  if (schema != "edgefl.assignment/1")
    return answerable("instruction: schema " + (schema.is_string() ? "'" + schema.get<std::string>() + "'" : schema.is_null() ? "None" : schema.dump()) + ", expected 'edgefl.assignment/1'; update edgefl "
                      "on this device to the coordinator's version");
  try {
    const json& ins = d.at("instruction");
    if (ins.at("schema") != "edgefl.instruction/1") throw std::invalid_argument("unknown instruction schema");
    Instruction i;
    i.round = integer(ins.at("round"));
    i.device_id = ins.at("device_id").get<std::string>();
    i.config_hash = ins.at("config_hash").get<std::string>();
    i.seed = integer(ins.at("seed"));
    i.lr = ins.at("lr").get<double>();
    const json& config = ins.at("config");
    if (!config.is_object()) throw std::invalid_argument("config is not an object");
    i.local_epochs = config.contains("local_epochs") ? integer(config["local_epochs"]) : 1;
    if (ins.contains("options") && !ins["options"].is_null()) {
      const json& o = ins["options"];
      if (!o.is_object()) throw std::invalid_argument("options is not an object");
      if (o.contains("predicted_peak_bytes") && !o["predicted_peak_bytes"].is_null())
        i.predicted_peak_bytes = integer(o["predicted_peak_bytes"]);
      if (o.contains("max_examples") && !o["max_examples"].is_null()) i.max_examples = integer(o["max_examples"]);
    }
    if (d.contains("artifacts") && !d["artifacts"].is_null())
      for (const auto& [role, id] : d["artifacts"].items()) i.artifacts[role] = id.get<std::string>();
    if (d.contains("shared") && !d["shared"].is_null())
      for (const auto& [id, group] : d["shared"].items()) {
        const std::string g = group.get<std::string>();
        if (!group_name_ok(g)) throw std::invalid_argument("group name " + g.substr(0, 40) + " is not one topic level");
        i.shared[id] = g;
      }
    if (i.round < 1 || i.local_epochs < 1) throw std::invalid_argument("round and local_epochs must be >= 1");
    out = std::move(i);
    return true;
  } catch (const std::exception& e) {
    return answerable(std::string("instruction: malformed (") + e.what() + ")");
  }
}

std::string ChunkManifest::to_json() const {
  return json{{"schema", "edgefl.chunks/1"}, {"id", id}, {"size", size}, {"chunk_size", chunk_size},
              {"chunks", chunks}}.dump();
}

bool parse_chunk_manifest(std::string_view payload, std::string_view expected_id, ChunkManifest& out,
                          std::string& why) {
  const std::string what = "artifact " + std::string(expected_id.substr(0, 12)) + ": manifest";
  json d;
  if (!parse_object(payload, d, what.c_str(), why)) return false;
  try {
    ChunkManifest m;
    m.id = d.at("id").get<std::string>();
    m.size = integer(d.at("size"));
    m.chunk_size = integer(d.at("chunk_size"));
    for (const auto& c : d.at("chunks")) m.chunks.push_back(c.get<std::string>());
    bool ok = d.value("schema", json()) == "edgefl.chunks/1" && m.id == expected_id && m.size >= 0 &&
              m.chunk_size > 0 && m.count() == (m.size + m.chunk_size - 1) / m.chunk_size;
    for (const auto& c : m.chunks) ok = ok && is_sha256(c);
    if (!ok) {
      why = what + ": the chunk manifest does not describe it";
      return false;
    }
    out = std::move(m);
    return true;
  } catch (const std::exception& e) {
    why = what + ": malformed chunk manifest (" + e.what() + ")";
    return false;
  }
}

bool parse_refusal(std::string_view payload, Refusal& out) {
  json d = json::parse(payload.begin(), payload.end(), nullptr, false);
  if (d.is_discarded() || !d.is_object()) return false;
  if (d.value("restart", false) == true) {
    out.restart = true;
    return true;
  }
  if (!d.contains("error")) return false;
  out.error = d["error"].is_string() ? d["error"].get<std::string>() : d["error"].dump();
  return true;
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool parse_set_manifest(std::string_view payload, SetManifest& out, std::string& why) {
  json d;
  if (!parse_object(payload, d, "manifest.json", why)) return false;
  try {
    if (d.at("schema") != "edgefl.manifest/1") throw std::invalid_argument("schema is not edgefl.manifest/1");
    SetManifest m;
    m.kind = d.at("kind").get<std::string>();
    m.backend = d.at("backend").get<std::string>();
    for (const auto& f : d.at("files")) {
      SetFile file{f.at("name").get<std::string>(), f.at("sha256").get<std::string>()};
      // a name may not leave the artifact folder (absolute, or a '..' part)
      const std::string& n = file.name;
      if (n.empty() || n[0] == '/' || n == ".." || n.rfind("../", 0) == 0 || n.find("/../") != std::string::npos ||
          (n.size() >= 3 && n.compare(n.size() - 3, 3, "/..") == 0))
        throw std::invalid_argument("file name '" + n.substr(0, 80) + "' leaves the artifact folder");
      if (!is_sha256(file.sha256)) throw std::invalid_argument("a file's sha256 is not 64 hex digits");
      m.files.push_back(std::move(file));
    }
    if (d.contains("prefix_id") && !d["prefix_id"].is_null()) {
      m.prefix_id = d["prefix_id"].get<std::string>();
      if (!is_sha256(*m.prefix_id)) throw std::invalid_argument("prefix_id is not a sha256");
    }
    if (d.contains("trainable"))
      for (const auto& t : d["trainable"]) {
        TensorSpec s{t.at("name").get<std::string>(), t.at("dtype").get<std::string>(), {}};
        int64_t elements = 1;
        for (const auto& n : t.at("shape")) {
          s.shape.push_back(integer(n));
          // bounded so that numel() and the buffer size (4 bytes each) cannot overflow: a tensor of 2^48 floats
          // is far beyond any device
          if (s.shape.back() < 0 || s.shape.back() > INT32_MAX) throw std::invalid_argument("a dimension out of range");
          if (s.shape.back() > 0 && elements > (int64_t{1} << 48) / s.shape.back())
            throw std::invalid_argument("a tensor of more than 2^48 elements");
          elements *= s.shape.back();
        }
        m.trainable.push_back(std::move(s));
      }
    out = std::move(m);
    return true;
  } catch (const std::exception& e) {
    why = std::string("manifest.json: malformed (") + e.what() + ")";
    return false;
  }
}

bool parse_round_notice(std::string_view payload, int64_t& round, bool& open, std::string& why) {
  json d;
  if (!parse_object(payload, d, "round notice", why)) return false;
  try {
    round = integer(d.at("round"));
    if (!d.at("open").is_boolean()) throw std::invalid_argument("open is not a boolean");
    open = d["open"].get<bool>();
    return true;
  } catch (const std::exception& e) {
    why = std::string("round notice: malformed (") + e.what() + ")";
    return false;
  }
}

bool parse_receipt(std::string_view payload, Receipt& out, std::string& why) {
  json d;
  if (!parse_object(payload, d, "receipt", why)) return false;
  try {
    const json& u = d.at("upload");
    out.upload = u.is_string() ? u.get<std::string>() : u.dump();
    out.taken = d.value("taken", json(false)) == true;
    out.reason = d.contains("reason") && d["reason"].is_string() ? d["reason"].get<std::string>() : "";
    return true;
  } catch (const std::exception& e) {
    why = std::string("receipt: malformed (") + e.what() + ")";
    return false;
  }
}

bool parse_topic(std::string_view topic, Topic& out) {
  std::vector<std::string_view> p;
  for (size_t start = 0;;) {
    const size_t slash = topic.find('/', start);
    p.push_back(topic.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (p.size() < 3 || p[0] != "fl" || p[1] != "v1") return false;
  const auto seq = [](std::string_view s, int64_t& v) {
    if (s.empty() || s.size() > 9) return false;
    v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    return true;
  };
  out = Topic{};
  if (p[2] == "broadcast" && p.size() == 4 && p[3] == "round") {
    out.kind = "broadcast";
    return true;
  }
  if (p[2] == "group" && p.size() >= 7 && p[4] == "art" && is_sha256(p[5])) {
    out.group = std::string(p[3]);
    out.sha = std::string(p[5]);
    if (p.size() == 7 && p[6] == "manifest") return out.kind = "manifest", true;
    if (p.size() == 8 && p[6] == "c" && seq(p[7], out.seq)) return out.kind = "chunk", true;
    return false;
  }
  if (p[2] != "dev" || p.size() < 6 || p[4] != "down") return false;
  if (p.size() == 6 && p[5] == "instr") return out.kind = "instr", true;
  if (p.size() == 6 && p[5] == "receipt") return out.kind = "receipt", true;
  if (p[5] == "artifact" && p.size() >= 8 && is_sha256(p[6])) {
    out.sha = std::string(p[6]);
    if (p.size() == 8 && p[7] == "manifest") return out.kind = "manifest", true;
    if (p.size() == 9 && p[7] == "c" && seq(p[8], out.seq)) return out.kind = "chunk", true;
  }
  return false;
}

}  // namespace edgefl::agent
