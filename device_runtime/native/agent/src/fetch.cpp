#include "fetch.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace edgefl::agent {
namespace {

const int WINDOW = 8;   // chunks in flight (edgefl/protocol/chunks.py): a group's early chunks kept at most

// Put a cached file at `dest`: a hard link (no copy; a change to it shows in the cache's hash check).
void place(const std::string& cached, const std::string& dest) {
  make_dirs(parent_of(dest));
  unlink(dest.c_str());
  if (link(cached.c_str(), dest.c_str()) != 0) {
    std::string bytes;
    if (!read_file(cached, bytes) || !write_file(dest, bytes)) throw FetchFailed("cannot place " + dest);
  }
}

}  // namespace

void Fetcher::check() {
  if (link_.stopping()) throw FetchEnded("the device is stopping");
  if (auto why = link_.superseded(link_.working)) throw FetchEnded(*why);
}

void Fetcher::want(PartialArtifact& part, bool resend) {
  nlohmann::json w{{"want", part.id()}, {"resend", resend}};
  if (part.manifest()) {
    w["chunk_size"] = part.manifest()->chunk_size;
    w["missing"] = nlohmann::json::parse(part.missing_json());
  } else {
    w["chunk_size"] = nullptr;
    w["missing"] = nullptr;
  }
  link_.wire().publish("fl/v1/dev/" + link_.device_id() + "/up/ack", w.dump());
}

PartialArtifact::Verdict Fetcher::on_chunk(PartialArtifact& part, int64_t seq, const std::string& data,
                                           bool acknowledge) {
  const auto verdict = part.accept(seq, data);
  const std::string ack = "fl/v1/dev/" + link_.device_id() + "/up/ack";
  if (verdict == PartialArtifact::BAD) {
    corrupt_chunks++;
    if (acknowledge) link_.wire().publish(ack, nlohmann::json{{"bad", part.id()}, {"seq", seq}}.dump());
    return verdict;
  }
  if (acknowledge) link_.wire().publish(ack, nlohmann::json{{"got", part.id()}, {"seq", seq}}.dump());
  return verdict;
}

namespace {

// What one fetch of a file met, for the line a fetch that was not clean leaves in the log.
struct Tally {
  size_t held_before = 0;
  int64_t received = 0, duplicates = 0, reconnects = 0;
  std::set<int64_t> bad;
  bool clean() const { return held_before == 0 && duplicates == 0 && reconnects == 0 && bad.empty(); }
  std::string line(const std::string& artifact, int64_t count) const {
    std::string out = "artifact " + artifact.substr(0, 12) + ": " + std::to_string(count) + " chunks: " +
                      std::to_string(held_before) + " held from an earlier fetch, " + std::to_string(received) +
                      " received, " + std::to_string(duplicates) + " duplicates, " + std::to_string(bad.size()) +
                      " failed their sha256";
    if (!bad.empty()) {
      out += " (chunk";
      int shown = 0;
      for (int64_t s : bad) {
        if (shown++ == 8) { out += " ..."; break; }
        out += " " + std::to_string(s);
      }
      out += ")";
    }
    return out + ", " + std::to_string(reconnects) + " reconnects";
  }
};

}  // namespace

std::string Fetcher::fetch(const std::string& artifact, double timeout_s) {
  check();
  ArtifactCache& cache = link_.cache();
  if (auto path = cache.get(artifact)) return *path;
  if (artifact == sha256_hex("")) return cache.put("");
  PartialArtifact part(cache, artifact);
  Tally tally;
  tally.held_before = part.held().size();
  std::set<int64_t> seen;   // the chunks a group's topics brought, good or bad
  const double deadline = now_s() + timeout_s;
  std::string group;
  if (auto it = shared_.find(artifact); it != shared_.end() && !silent_.count(it->second)) group = it->second;
  std::vector<std::string> subscribed;
  std::map<int64_t, std::string> early;   // a group's chunks that came before its manifest
  const std::string base = "fl/v1/group/" + group + "/art/" + artifact;
  if (!group.empty()) {   // one SUBSCRIBE: the broker sends the manifest's retained message first
    if (!part.manifest()) subscribed.push_back(base + "/manifest");
    subscribed.push_back(base + "/c/+");
    link_.wire().subscribe(subscribed);
  } else {
    want(part, true);
  }
  struct Unsubscribe {   // whatever ends the fetch
    Link& link;
    std::vector<std::string>& filters;
    ~Unsubscribe() { if (!filters.empty()) link.wire().unsubscribe(filters); }
  } unsubscribe{link_, subscribed};
  // the coordinator sends what the group's topics did not bring whole; the device reads them no longer
  const auto leave_group = [&] {
    if (!subscribed.empty()) link_.wire().unsubscribe(subscribed);
    subscribed.clear();
    group.clear();
    want(part, true);
  };
  const auto take = [&](int64_t seq, const std::string& data, bool via_group) {
    const auto verdict = on_chunk(part, seq, data, !via_group);
    if (verdict == PartialArtifact::OK) tally.received++;
    else if (verdict == PartialArtifact::DUP) tally.duplicates++;
    else tally.bad.insert(seq);
    if (via_group && seq >= 0 && seq < part.manifest()->count()) seen.insert(seq);
  };
  double heard = now_s();
  bool dropped = false;
  int stalls = 0;
  const int64_t corrupt_before = corrupt_chunks;
  while (true) {
    check();
    if (corrupt_chunks - corrupt_before > std::max<int64_t>(16, 2 * (part.manifest() ? part.manifest()->count() : 0)))
      throw FetchFailed("artifact " + artifact.substr(0, 12) + ": its chunks keep failing their sha256 (the "
                        "coordinator's copy is not that artifact any more); dropped");
    if (part.complete()) {
      const int64_t size = part.manifest()->size, count = part.manifest()->count();
      std::string why;
      if (auto path = part.finish(why)) {
        if (!tally.clean()) log_(EDGEFL_LOG_INFO, tally.line(artifact, count));
        if (shared_.count(artifact))   // no acknowledgements told the coordinator: say it here
          link_.wire().publish("fl/v1/dev/" + link_.device_id() + "/up/metrics",
                               nlohmann::json{{"state", "downloading"}, {"artifact", artifact}, {"bytes", size}}.dump());
        return *path;
      }
      if (!why.empty()) throw FetchFailed(why);
      leave_group();     // chunks that did not add up: the coordinator sends them again
      continue;
    }
    const double remaining = deadline - now_s();
    if (remaining <= 0) {
      const std::string held = part.manifest() ? std::to_string(part.held().size()) + "/" +
                                                     std::to_string(part.manifest()->count()) + " chunks"
                                               : "no manifest";
      throw FetchFailed("artifact " + artifact.substr(0, 12) + " not complete after " +
                        std::to_string(static_cast<int>(timeout_s)) + " s (" + held +
                        "); is the coordinator running? A later fetch resumes");
    }
    const double wait = !group.empty() ? group_wait_s_ : std::min(stall_s_ * std::pow(2.0, stalls), resend_after_s_);
    const double asked = now_s();
    auto e = link_.pump(std::min(wait, remaining), artifact);
    if (!e) {
      if (now_s() - asked < std::min(wait, remaining) - 1e-3) continue;   // a stray message, not silence
      if (!group.empty()) {      // the group's topics brought what they hold: ask the coordinator for the rest
        if (!part.manifest()) {
          silent_.insert(group);
          log_(EDGEFL_LOG_WARNING, "group " + group + "'s topics hold no artifact " + artifact.substr(0, 12) +
                                       " (may this login read fl/v1/group/" + group + "/?); asking the coordinator");
        }
        want(part, true);
        group.clear();
        heard = now_s();
        dropped = false;
        continue;
      }
      const bool lost = dropped || now_s() - heard >= resend_after_s_;
      want(part, lost);
      if (lost) heard = now_s(), dropped = false;
      stalls++;      // each silence waits twice as long before the next ask, up to resend_after_s
      continue;
    }
    if (e->kind == Event::WAKE) continue;     // check() says whether this fetch goes on
    heard = now_s();
    stalls = 0;
    if (e->kind == Event::RECONNECTED) {
      tally.reconnects++;
      if (part.manifest())     // what it holds stays: only the rest is wanted (or taken from the group's topics)
        log_(EDGEFL_LOG_INFO, "artifact " + artifact.substr(0, 12) + ": connected again holding " +
                                  std::to_string(part.held().size()) + "/" + std::to_string(part.manifest()->count()) +
                                  " chunks; the fetch goes on from them");
      if (group.empty()) want(part, true);    // a group's renewed subscription brings its retained messages again
      continue;
    }
    Topic t;
    parse_topic(e->topic, t);
    const bool via_group = !t.group.empty();
    if (via_group && e->payload.empty()) continue;   // a group's message cleared (an old round's)
    std::string why;
    if (t.kind == "manifest") {
      ChunkManifest m;
      if (via_group) {
        if (parse_chunk_manifest(e->payload, artifact, m, why)) {
          if (!part.manifest() || !(*part.manifest() == m)) part.start(m), seen.clear();
        } else {
          log_(EDGEFL_LOG_WARNING, why);
          if (!group.empty()) want(part, true), group.clear();
        }
        continue;
      }
      Refusal r;
      if (parse_refusal(e->payload, r)) {
        if (r.restart) {
          part.discard();
          want(part, true);
          continue;
        }
        throw FetchFailed("the coordinator refused artifact " + artifact.substr(0, 12) + ": " + r.error);
      }
      if (!parse_chunk_manifest(e->payload, artifact, m, why)) throw FetchFailed(why);
      if (!part.manifest() || !(*part.manifest() == m)) part.start(m);
    } else if (!part.manifest()) {       // a chunk before its manifest: the next ask resends it
      if (via_group && early.size() < WINDOW) early[t.seq] = e->payload;
      else dropped = true;
    } else {
      take(t.seq, e->payload, via_group);
    }
    if (!early.empty() && part.manifest()) {
      for (const auto& [seq, data] : early) take(seq, data, true);
      early.clear();
    }
    // the group's topics brought every chunk once and some failed their sha256: no use waiting out their
    // silence, the coordinator sends those
    if (!group.empty() && part.manifest() && !part.complete() &&
        static_cast<int64_t>(seen.size()) >= part.manifest()->count())
      leave_group();
  }
}

std::string Fetcher::fetch_artifact(const std::string& artifact, double timeout_s, const std::string& into) {
  const std::string folder = into.empty() ? link_.cache().folder() + "/artifacts/" + artifact : into;
  const std::string source = fetch(artifact, timeout_s);
  std::string text, why;
  SetManifest m;
  if (!read_file(source, text) || !parse_set_manifest(text, m, why))
    throw FetchFailed("artifact " + artifact.substr(0, 12) + ": not a manifest.json (" + why + ")");
  for (const auto& f : m.files) place(fetch(f.sha256, timeout_s), folder + "/" + f.name);
  if (m.prefix_id) fetch_artifact(*m.prefix_id, timeout_s, folder + "/prefix");
  place(source, folder + "/manifest.json");
  if (into.empty())    // the whole set is here: the coordinator's live view shows this device training
    link_.wire().publish("fl/v1/dev/" + link_.device_id() + "/up/metrics",
                         nlohmann::json{{"state", "training"}, {"artifact", artifact}}.dump());
  return folder;
}

}  // namespace edgefl::agent
