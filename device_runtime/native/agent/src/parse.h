// Parsers of what arrives from the network (instructions, chunk manifests, artifact set manifests, round
// notices, receipts, topics): free functions over bytes, no I/O and no state, so each can be fuzzed alone.
// Each answers false with `why` (one line) for anything it cannot take; none throws.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace edgefl::agent {

bool is_sha256(std::string_view s);
bool is_upload_id(std::string_view s);

// edgefl.assignment/1 (edgefl/protocol/envelopes.py Assignment): what a device needs of it.
struct Instruction {
  int64_t round = 0;
  std::string device_id, config_hash;
  int64_t seed = 0, local_epochs = 1;
  double lr = 0;
  std::optional<int64_t> predicted_peak_bytes, max_examples;   // options
  std::map<std::string, std::string> artifacts;                 // role -> artifact id
  std::map<std::string, std::string> shared;                    // artifact id -> group
};

// An instruction that cannot be followed but names its round: answered with a failed report (Unreadable).
struct Unreadable {
  int64_t round = 0;
  std::string config_hash, reason;
};

// true: `out` is filled. false: `why`; `unreadable` is set when a round can still be answered.
bool parse_instruction(std::string_view payload, Instruction& out, std::string& why,
                       std::optional<Unreadable>* unreadable = nullptr);

// edgefl.chunks/1 (edgefl/protocol/chunks.py ChunkManifest), checked to describe `expected_id`.
struct ChunkManifest {
  std::string id;
  int64_t size = 0, chunk_size = 0;
  std::vector<std::string> chunks;
  int64_t count() const { return static_cast<int64_t>(chunks.size()); }
  bool operator==(const ChunkManifest& o) const {
    return id == o.id && size == o.size && chunk_size == o.chunk_size && chunks == o.chunks;
  }
  std::string to_json() const;
};
bool parse_chunk_manifest(std::string_view payload, std::string_view expected_id, ChunkManifest& out,
                          std::string& why);

// What a coordinator says on a manifest topic instead of a manifest: {"id", "error", "restart"}.
struct Refusal {
  bool restart = false;
  std::string error;
};
// true when the payload is a refusal (then `out` holds it).
bool parse_refusal(std::string_view payload, Refusal& out);

// An artifact's manifest.json (docs/artifact-format.md section 2): the files to fetch and the prefix.
struct SetFile {
  std::string name, sha256;
};
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t numel() const;
};
struct SetManifest {
  std::string kind, backend;
  std::vector<SetFile> files;
  std::optional<std::string> prefix_id;
  std::vector<TensorSpec> trainable;  // upload-buffer order
};
bool parse_set_manifest(std::string_view payload, SetManifest& out, std::string& why);

// broadcast/round: {"round": r, "open": bool}
bool parse_round_notice(std::string_view payload, int64_t& round, bool& open, std::string& why);

// down/receipt: {"round", "upload", "taken", "reason"}
struct Receipt {
  std::string upload, reason;
  bool taken = false;
};
bool parse_receipt(std::string_view payload, Receipt& out, std::string& why);

// A topic this device receives (edgefl/topics.py parse): kind instr | receipt | manifest | chunk | broadcast.
struct Topic {
  std::string kind, sha, group;   // group: set for a group's manifest or chunk
  int64_t seq = -1;
};
bool parse_topic(std::string_view topic, Topic& out);

}  // namespace edgefl::agent
