// An ExecuTorch artifact set as docs/artifact-format.md describes it: the suffix folder's manifest.json
// and, when layers are frozen, prefix/manifest.json, every named file checked against its size and sha256
// before anything is loaded (a device trains nothing it cannot prove is what the server exported).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_fields.h"
#include "optimizer.h"

namespace edgefl {

struct IOSpec {
  std::string name;
  std::vector<int64_t> shape;  // symbolic dimensions are -1
  std::string dtype;           // float32 | int64
};

struct TensorEntry {
  std::string name;   // global name (the upload's)
  std::string local;  // the program's own name
  std::vector<int64_t> shape;
  std::string kind;   // parameter | statistic | counter
  int64_t numel() const;
};

struct FileEntry {
  std::string name;  // relative to the artifact folder
  int64_t bytes = 0;
  std::string sha256, role;
};

struct Manifest {
  std::string folder;
  Json json;       // the whole document
  std::string id;  // sha256 of manifest.json's bytes
  std::string config_hash;
  Json predicted_peak;  // predicted.peak_memory_bytes, or null
  std::vector<FileEntry> files;
  std::vector<IOSpec> inputs, outputs;
  std::vector<TensorEntry> trainable;
  int64_t batch = 0;  // the batch the program is planned for (extra.batch)
  std::string file(const std::string& role) const;  // path of the file with that role
};

struct ArtifactSet {
  Manifest suffix;
  bool has_prefix = false;
  std::string prefix_id;  // the suffix's prefix_id: the id prefix/manifest.json must have
  Manifest prefix;
  OptimizerSpec optimizer;
  std::string key_prefix;               // extra.prefix: parameters' names in the program
  std::vector<std::string> statistics;  // extra.statistics: BN running statistics in input order
  int64_t classes = 0;                  // the logits' last dimension
  const IOSpec& model_input() const { return has_prefix ? prefix.inputs.at(0) : suffix.inputs.at(0); }
};

// Reads and verifies the set in `folder` (throws UserError naming the file and the fix).
ArtifactSet open_artifact_set(const std::string& folder, bool verify);

// The parsers of open_artifact_set over bytes already in memory (what the fuzz targets call):
// `size` bytes of `folder`/manifest.json, and the suffix's own fields of a parsed manifest.
Manifest parse_manifest(const char* data, size_t size, const std::string& folder);
void read_suffix_fields(ArtifactSet& set);

}  // namespace edgefl
