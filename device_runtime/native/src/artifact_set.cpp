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

std::vector<int64_t> dims(const Json& shape) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < shape.size(); i++) out.push_back(shape[i].is_string() ? -1 : shape[i].as_int64());
  return out;
}

std::vector<IOSpec> io_specs(const Json& list) {
  std::vector<IOSpec> out;
  for (size_t i = 0; i < list.size(); i++)
    out.push_back({list[i]["name"].as_string(), dims(list[i]["shape"]), list[i]["dtype"].as_string()});
  return out;
}

void verify_files(const Manifest& m) {
  const Json& files = m.json["files"];
  for (size_t i = 0; i < files.size(); i++) {
    const std::string name = files[i]["name"].as_string();
    if (name.empty() || name[0] == '/' || name.find("..") != std::string::npos)
      throw UserError(m.folder + "/manifest.json: file name '" + name + "' leaves the artifact folder");
    const std::string path = m.folder + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0)
      throw UserError(path + ": named in the manifest but missing; re-export or re-download the artifact");
    if (static_cast<int64_t>(st.st_size) != files[i]["bytes"].as_int64())
      throw UserError(path + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                      std::to_string(files[i]["bytes"].as_int64()) +
                      "; the file is truncated or was changed: re-export or re-download the artifact");
    if (sha256_file(path) != files[i]["sha256"].as_string())
      throw UserError(path + ": sha256 does not match the manifest; the file is corrupt or was changed: "
                      "re-export or re-download the artifact");
  }
}

Manifest read_manifest(const std::string& folder, bool verify) {
  Manifest m;
  m.folder = folder;
  const std::string path = folder + "/manifest.json";
  const std::string text = read_text(path);
  m.id = sha256_hex(text.data(), text.size());
  m.json = Json::parse(text, path);
  try {
    if (m.json["schema"].as_string() != "edgefl.manifest/1")
      throw UserError(path + ": schema is '" + m.json["schema"].as_string() +
                      "', expected 'edgefl.manifest/1'; re-export the artifact with this edgefl version");
    if (m.json["backend"].as_string() != "executorch")
      throw UserError(path + ": exported for " + m.json["backend"].as_string() +
                      ", not executorch; export the plan with --backend executorch");
    m.inputs = io_specs(m.json["inputs"]);
    m.outputs = io_specs(m.json["outputs"]);
    if (m.json.has("trainable")) {
      const Json& t = m.json["trainable"];
      for (size_t i = 0; i < t.size(); i++)
        m.trainable.push_back({t[i]["name"].as_string(), t[i]["local"].as_string(), dims(t[i]["shape"]),
                               t[i].has("kind") ? t[i]["kind"].as_string() : "parameter"});
    }
    m.batch = m.json["extra"]["batch"].as_int64();
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw UserError(path + ": malformed manifest (" + what + "); re-export the artifact");
  }
  if (verify) verify_files(m);
  return m;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Manifest::file(const std::string& role) const {
  const Json& files = json["files"];
  for (size_t i = 0; i < files.size(); i++)
    if (files[i]["role"].as_string() == role) return folder + "/" + files[i]["name"].as_string();
  throw UserError(folder + "/manifest.json: no file with role '" + role + "'; re-export the artifact");
}

ArtifactSet open_artifact_set(const std::string& folder, bool verify) {
  ArtifactSet set;
  set.suffix = read_manifest(folder, verify);
  const Json& m = set.suffix.json;
  const std::string path = folder + "/manifest.json";
  try {
    if (m["kind"].as_string() != "suffix")
      throw UserError(path + ": a " + m["kind"].as_string() +
                      " artifact; give the artifact set folder (the one holding the suffix manifest)");
    const Json& opt = m["optimizer"];
    set.optimizer.name = opt["name"].as_string();
    if (set.optimizer.name != "sgd" && set.optimizer.name != "adamw")
      throw UserError(path + ": optimizer '" + set.optimizer.name + "' is not one this trainer knows (sgd, adamw)");
    set.optimizer.momentum = static_cast<float>(opt["momentum"].as_double());
    set.optimizer.weight_decay = static_cast<float>(opt["weight_decay"].as_double());
    set.optimizer.beta1 = static_cast<float>(opt["betas"][size_t{0}].as_double());
    set.optimizer.beta2 = static_cast<float>(opt["betas"][size_t{1}].as_double());
    set.optimizer.eps = static_cast<float>(opt["eps"].as_double());
    set.key_prefix = m["extra"]["prefix"].as_string();
    const Json& stats = m["extra"]["statistics"];
    for (size_t i = 0; i < stats.size(); i++) set.statistics.push_back(stats[i].as_string());
    if (set.suffix.outputs.size() < 2 || set.suffix.outputs[0].name != "loss")
      throw UserError(path + ": a suffix needs 'loss' and 'logits' as its first outputs; re-export it");
    set.classes = set.suffix.outputs[1].shape.back();
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw UserError(path + ": malformed manifest (" + what + "); re-export the artifact");
  }
  if (!m["prefix_id"].is_null()) {
    set.has_prefix = true;
    set.prefix = read_manifest(folder + "/prefix", verify);
    if (set.prefix.id != m["prefix_id"].as_string())
      throw UserError(folder + "/prefix/manifest.json: id " + set.prefix.id.substr(0, 16) +
                      " is not the prefix the suffix needs (" + m["prefix_id"].as_string().substr(0, 16) +
                      "); copy the set folder again");
  }
  return set;
}

}  // namespace edgefl
