// The device's artifact cache, addressed by sha256, in the layout of device_runtime/cache.py (so a device can
// switch agents and keep its cache): <dir>/<sha> a complete file whose bytes hash to its name (checked every
// time it is used); <dir>/partial/<sha> one being fetched, with <sha>.manifest (its chunk manifest) and
// <sha>.held (one line per chunk written), so a fetch cut off resumes with the chunks it has;
// <dir>/artifacts/<id>/ an artifact set as the trainer opens it (hard links into the cache).
// trim() keeps the set just trained and at most the budget beyond it, least recently used files first.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "parse.h"

namespace edgefl::agent {

class ArtifactCache {
 public:
  ArtifactCache(std::string folder, int64_t budget_bytes, double partial_ttl_s = 3600);
  const std::string& folder() const { return folder_; }
  std::string path(const std::string& artifact) const { return folder_ + "/" + artifact; }
  std::optional<std::string> get(const std::string& artifact);  // verified, its use noted; a bad file is removed
  std::string put(const std::string& data);
  int64_t size() const;                                          // bytes on disk, a linked file once
  int64_t trim(const std::string& keep);                         // its size after

 private:
  std::string folder_;
  int64_t budget_;
  double partial_ttl_s_;
};

// A file being fetched: chunks land in place (pwrite at seq * chunk_size), each checked first; the whole
// file's hash runs along while chunks arrive in order, so a clean fetch reads nothing back.
class PartialArtifact {
 public:
  PartialArtifact(ArtifactCache& cache, const std::string& artifact);
  ~PartialArtifact();
  const std::string& id() const { return id_; }
  const std::optional<ChunkManifest>& manifest() const { return manifest_; }
  const std::set<int64_t>& held() const { return held_; }
  void start(const ChunkManifest& manifest);
  std::string missing_json() const;    // [seq, ...] not held
  bool complete() const { return manifest_ && static_cast<int64_t>(held_.size()) == manifest_->count(); }
  enum Verdict { OK, DUP, BAD };
  Verdict accept(int64_t seq, const std::string& data);
  // The verified file moved into the cache, or nothing (chunks that no longer match are dropped: fetch them
  // again); `why` is set when the manifest itself is wrong (every chunk matches, the whole does not).
  std::optional<std::string> finish(std::string& why);
  void discard();

 private:
  ArtifactCache& cache_;
  std::string id_, data_path_, manifest_path_, held_path_;
  std::optional<ChunkManifest> manifest_;
  std::set<int64_t> held_;
  struct Running;
  Running* hash_;
  int64_t hashed_ = 0;
};

}  // namespace edgefl::agent
