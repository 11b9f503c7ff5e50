#include "artifact_set.h"

#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "errors.h"
#include "sha256.h"

namespace edgefl {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": missing; not an artifact folder (export one with 'edgefl export')");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A shape: each dimension an int32 (the runtime's sizes) or a string (symbolic, -1 here), and the count of
// elements bounded, so that no product a reader forms from it can overflow.
std::vector<int64_t> dims(const Field& shape) {
  constexpr int64_t kMaxDim = 0x7fffffff, kMaxElements = int64_t(1) << 48;
  std::vector<int64_t> out;
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); i++) {
    const int64_t d = shape[i].is_string() ? -1 : shape[i].as_int64();
    if (!shape[i].is_string() && (d < 0 || d > kMaxDim))
      throw UserError(shape[i].path() + ": dimension " + std::to_string(d) + " is out of range");
    if (d > 0 && elements > kMaxElements / d)
      throw UserError(shape.path() + ": more than 2^48 elements");
    elements *= d > 0 ? d : 1;
    out.push_back(d);
  }
  return out;
}

std::vector<IOSpec> io_specs(const Field& list) {
  std::vector<IOSpec> out;
  for (size_t i = 0; i < list.size(); i++)
    out.push_back({list[i]["name"].as_string(), dims(list[i]["shape"]), list[i]["dtype"].as_string()});
  return out;
}

// Runs `read`; a field's error becomes one line naming the manifest and the field.
template <class F>
void fields_of(const std::string& path, F&& read) {
  try {
    read();
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw UserError(path + ": malformed manifest (" + what + "); re-export the artifact");
  }
}

void verify_files(const Manifest& m) {
  for (const FileEntry& f : m.files) {
    if (f.name.empty() || f.name[0] == '/' || f.name.find("..") != std::string::npos)
      throw UserError(m.folder + "/manifest.json: file name '" + f.name + "' leaves the artifact folder");
    const std::string path = m.folder + "/" + f.name;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0)
      throw UserError(path + ": named in the manifest but missing; re-export or re-download the artifact");
    if (static_cast<int64_t>(st.st_size) != f.bytes)
      throw UserError(path + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                      std::to_string(f.bytes) +
                      "; the file is truncated or was changed: re-export or re-download the artifact");
    if (sha256_file(path) != f.sha256)
      throw UserError(path + ": sha256 does not match the manifest; the file is corrupt or was changed: "
                      "re-export or re-download the artifact");
  }
}

Manifest read_manifest(const std::string& folder, bool verify) {
  const std::string text = read_text(folder + "/manifest.json");
  Manifest m = parse_manifest(text.data(), text.size(), folder);
  if (verify) verify_files(m);
  return m;
}

}  // namespace

Manifest parse_manifest(const char* data, size_t size, const std::string& folder) {
  Manifest m;
  m.folder = folder;
  const std::string path = folder + "/manifest.json";
  m.id = sha256_hex(data, size);
  m.json = parse_json(data, size, path);
  const Field doc(m.json);
  fields_of(path, [&] {
    if (doc["schema"].as_string() != "edgefl.manifest/1")
      throw UserError(path + ": schema is '" + detail::printable(doc["schema"].as_string()) +
                      "', expected 'edgefl.manifest/1'; re-export the artifact with this edgefl version");
    if (doc["backend"].as_string() != "executorch")
      throw UserError(path + ": exported for " + detail::printable(doc["backend"].as_string()) +
                      ", not executorch; export the plan with --backend executorch");
    m.config_hash = doc["config_hash"].as_string();
    m.inputs = io_specs(doc["inputs"]);
    m.outputs = io_specs(doc["outputs"]);
    const Field files = doc["files"];
    for (size_t i = 0; i < files.size(); i++)
      m.files.push_back({files[i]["name"].as_string(), files[i]["bytes"].as_int64(), files[i]["sha256"].as_string(),
                         files[i]["role"].as_string()});
    if (doc.has("trainable")) {
      const Field t = doc["trainable"];
      for (size_t i = 0; i < t.size(); i++)
        m.trainable.push_back({t[i]["name"].as_string(), t[i]["local"].as_string(), dims(t[i]["shape"]),
                               t[i].has("kind") ? t[i]["kind"].as_string() : "parameter"});
    }
    m.batch = doc["extra"]["batch"].as_int64();
    if (m.batch < 1 || m.batch > 0x7fffffff)
      throw UserError("extra.batch: " + std::to_string(m.batch) + " is not a batch size");
    if (doc.has("predicted") && !doc["predicted"].is_null() && doc["predicted"].has("peak_memory_bytes"))
      m.predicted_peak = doc["predicted"]["peak_memory_bytes"].json();
  });
  return m;
}

void read_suffix_fields(ArtifactSet& set) {
  const Field m(set.suffix.json);
  const std::string path = set.suffix.folder + "/manifest.json";
  fields_of(path, [&] {
    if (m["kind"].as_string() != "suffix")
      throw UserError(path + ": a " + detail::printable(m["kind"].as_string()) +
                      " artifact; give the artifact set folder (the one holding the suffix manifest)");
    const Field opt = m["optimizer"];
    set.optimizer.name = opt["name"].as_string();
    if (set.optimizer.name != "sgd" && set.optimizer.name != "adamw")
      throw UserError(path + ": optimizer '" + detail::printable(set.optimizer.name) +
                      "' is not one this trainer knows (sgd, adamw)");
    set.optimizer.momentum = static_cast<float>(opt["momentum"].as_double());
    set.optimizer.weight_decay = static_cast<float>(opt["weight_decay"].as_double());
    set.optimizer.beta1 = static_cast<float>(opt["betas"][size_t{0}].as_double());
    set.optimizer.beta2 = static_cast<float>(opt["betas"][size_t{1}].as_double());
    set.optimizer.eps = static_cast<float>(opt["eps"].as_double());
    set.key_prefix = m["extra"]["prefix"].as_string();
    const Field stats = m["extra"]["statistics"];
    for (size_t i = 0; i < stats.size(); i++) set.statistics.push_back(stats[i].as_string());
    if (set.suffix.outputs.size() < 2 || set.suffix.outputs[0].name != "loss")
      throw UserError(path + ": a suffix needs 'loss' and 'logits' as its first outputs; re-export it");
    if (set.suffix.outputs[1].shape.empty())
      throw UserError(path + ": outputs[1] (logits) has no dimensions; re-export it");
    set.classes = set.suffix.outputs[1].shape.back();
    const Field prefix_id = m["prefix_id"];
    set.has_prefix = !prefix_id.is_null();
    if (set.has_prefix) set.prefix_id = prefix_id.as_string();
  });
}

ArtifactSet open_artifact_set(const std::string& folder, bool verify) {
  ArtifactSet set;
  set.suffix = read_manifest(folder, verify);
  read_suffix_fields(set);
  if (set.has_prefix) {
    set.prefix = read_manifest(folder + "/prefix", verify);
    if (set.prefix.id != set.prefix_id)
      throw UserError(folder + "/prefix/manifest.json: id " + set.prefix.id.substr(0, 16) +
                      " is not the prefix the suffix needs (" + detail::printable(set.prefix_id.substr(0, 16)) +
                      "); copy the set folder again");
  }
  return set;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Manifest::file(const std::string& role) const {
  for (const FileEntry& f : files)
    if (f.role == role) return folder + "/" + f.name;
  throw UserError(folder + "/manifest.json: no file with role '" + role + "'; re-export the artifact");
}

}  // namespace edgefl
