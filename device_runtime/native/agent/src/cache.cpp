#include "cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <utime.h>
#include <vector>

#include "sha256.h"
#include "util.h"

namespace edgefl::agent {
namespace {

// Every regular file under `dir` (recursively) with its stat.
void walk(const std::string& dir, std::vector<std::pair<std::string, struct stat>>& out) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string p = dir + "/" + name;
    struct stat st {};
    if (lstat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) walk(p, out);
    else if (S_ISREG(st.st_mode)) out.emplace_back(p, st);
  }
  closedir(d);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

}  // namespace

ArtifactCache::ArtifactCache(std::string folder, int64_t budget_bytes, double partial_ttl_s)
    : folder_(std::move(folder)), budget_(budget_bytes), partial_ttl_s_(partial_ttl_s) {
  if (!make_dirs(folder_ + "/partial"))
    throw UserError("--cache " + folder_ + ": cannot create the artifact cache there; give a writable folder");
}

std::optional<std::string> ArtifactCache::get(const std::string& artifact) {
  const std::string p = path(artifact);
  if (!is_file(p)) return std::nullopt;
  if (sha256_file(p) != artifact) {
    unlink(p.c_str());
    return std::nullopt;
  }
  utime(p.c_str(), nullptr);   // its last use, for trim
  return p;
}

std::string ArtifactCache::put(const std::string& data) {
  const std::string id = sha256_hex(data);
  const std::string tmp = folder_ + "/partial/" + id + ".put";
  std::ofstream(tmp, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  std::rename(tmp.c_str(), path(id).c_str());
  return path(id);
}

int64_t ArtifactCache::size() const {
  std::vector<std::pair<std::string, struct stat>> files;
  walk(folder_, files);
  std::map<std::pair<dev_t, ino_t>, int64_t> seen;
  for (const auto& [p, st] : files) seen[{st.st_dev, st.st_ino}] = st.st_size;
  int64_t total = 0;
  for (const auto& kv : seen) total += kv.second;
  return total;
}

int64_t ArtifactCache::trim(const std::string& keep) {
  std::set<std::pair<dev_t, ino_t>> kept;
  if (!keep.empty()) {
    std::vector<std::pair<std::string, struct stat>> files;
    walk(keep, files);
    for (const auto& [p, st] : files) kept.insert({st.st_dev, st.st_ino});
  }
  const std::string sets = folder_ + "/artifacts";
  for (const auto& name : entries(sets))
    if (keep.empty() || sets + "/" + name != keep) remove_tree(sets + "/" + name);
  const time_t now = time(nullptr);
  for (const auto& name : entries(folder_ + "/partial")) {
    struct stat st {};
    const std::string p = folder_ + "/partial/" + name;
    if (stat(p.c_str(), &st) == 0 && now - st.st_mtime > partial_ttl_s_) unlink(p.c_str());
  }
  std::vector<std::tuple<time_t, int64_t, std::string>> free;
  int64_t held = 0;
  for (const auto& name : entries(folder_)) {
    struct stat st {};
    const std::string p = folder_ + "/" + name;
    if (lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || kept.count({st.st_dev, st.st_ino})) continue;
    free.emplace_back(st.st_mtime, st.st_size, p);
    held += st.st_size;
  }
  std::sort(free.begin(), free.end());
  for (const auto& [mtime, size, p] : free) {   // least recently used first
    if (held <= budget_) break;
    unlink(p.c_str());
    held -= size;
  }
  return this->size();
}

struct PartialArtifact::Running {
  edgefl::Sha256 h;
};

PartialArtifact::PartialArtifact(ArtifactCache& cache, const std::string& artifact)
    : cache_(cache), id_(artifact), hash_(new Running) {
  data_path_ = cache.folder() + "/partial/" + artifact;
  manifest_path_ = data_path_ + ".manifest";
  held_path_ = data_path_ + ".held";
  std::string text;
  if (read_file(manifest_path_, text)) {
    ChunkManifest m;
    std::string why;
    if (!parse_chunk_manifest(text, artifact, m, why)) {
      discard();
      return;
    }
    manifest_ = m;
    std::string held;
    read_file(held_path_, held);
    std::istringstream lines(held);
    std::string line;
    // a line is complete only with its newline: the last, cut off by a crash, does not count
    while (std::getline(lines, line) && !lines.eof()) {
      char* end = nullptr;
      const long long seq = std::strtoll(line.c_str(), &end, 10);
      if (!line.empty() && *end == '\0' && seq >= 0 && seq < m.count()) held_.insert(seq);
    }
  }
}

PartialArtifact::~PartialArtifact() { delete hash_; }

void PartialArtifact::start(const ChunkManifest& m) {
  manifest_ = m;
  held_.clear();
  hash_->h.reset();
  hashed_ = 0;
  const int fd = open(data_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (ftruncate(fd, m.size) != 0) { /* a full disk: the chunks' writes say so */ }
    close(fd);
  }
  std::ofstream(held_path_, std::ios::trunc);
  std::ofstream(manifest_path_, std::ios::trunc) << m.to_json();
}

std::string PartialArtifact::missing_json() const {
  std::string out = "[";
  for (int64_t s = 0; s < manifest_->count(); s++)
    if (!held_.count(s)) out += (out.size() > 1 ? "," : "") + std::to_string(s);
  return out + "]";
}

PartialArtifact::Verdict PartialArtifact::accept(int64_t seq, const std::string& data) {
  if (held_.count(seq)) return DUP;
  if (seq < 0 || seq >= manifest_->count() || sha256_hex(data) != manifest_->chunks[static_cast<size_t>(seq)])
    return BAD;
  const int fd = open(data_path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return BAD;
  const ssize_t n = pwrite(fd, data.data(), data.size(), seq * manifest_->chunk_size);
  close(fd);
  if (n != static_cast<ssize_t>(data.size())) return BAD;
  std::ofstream(held_path_, std::ios::app) << seq << "\n";
  held_.insert(seq);
  if (seq == hashed_) {
    hash_->h.update(data.data(), data.size());
    hashed_++;
  }
  return OK;
}

std::optional<std::string> PartialArtifact::finish(std::string& why) {
  const std::string whole = hashed_ == manifest_->count() ? hash_->h.hex_digest() : sha256_file(data_path_);
  if (whole == id_) {
    std::rename(data_path_.c_str(), cache_.path(id_).c_str());
    discard();
    return cache_.path(id_);
  }
  std::string bytes;
  read_file(data_path_, bytes);
  for (auto it = held_.begin(); it != held_.end();) {
    const int64_t start = *it * manifest_->chunk_size;
    const int64_t end = std::min(start + manifest_->chunk_size, manifest_->size);
    const bool ok = end <= static_cast<int64_t>(bytes.size()) &&
                    sha256_hex(bytes.substr(static_cast<size_t>(start), static_cast<size_t>(end - start))) ==
                        manifest_->chunks[static_cast<size_t>(*it)];
    it = ok ? std::next(it) : held_.erase(it);
  }
  if (complete()) {
    discard();
    why = "artifact " + id_.substr(0, 12) + ": its chunks match the chunk manifest but the whole does not hash to "
          "its id; the coordinator sent a wrong manifest";
    return std::nullopt;
  }
  std::ofstream held(held_path_, std::ios::trunc);
  for (int64_t s : held_) held << s << "\n";
  hash_->h.reset();
  hashed_ = 0;
  return std::nullopt;
}

void PartialArtifact::discard() {
  unlink(data_path_.c_str());
  unlink(manifest_path_.c_str());
  unlink(held_path_.c_str());
  manifest_.reset();
  held_.clear();
}

}  // namespace edgefl::agent
