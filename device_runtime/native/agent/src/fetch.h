// Artifacts by sha256 from the cache, or fetched (and resumed) from the coordinator, or from the group's
// retained topics (device protocol rule 3; device_runtime/fetch.py): every chunk checked and acknowledged,
// silence asks again after 5 s doubling to 60 s, after which (or on a reconnect) everything missing is asked
// to be sent again; a group's topics that bring nothing for 15 s hand over to the coordinator, and so do
// topics that brought every chunk once with some failing their sha256, and a reconnect in the middle of a
// group's file (the device asks for the chunks it lacks instead of taking the republished file whole); chunks
// that keep failing end the fetch, so do its deadline and stopping. A fetch that was not clean (resumed,
// reconnected, duplicates, bad chunks) says in one log line what it held, received and refused. An artifact
// set is its manifest.json, every file it names and its prefix, hard-linked into one folder the trainer opens.
#pragma once

#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "link.h"

namespace edgefl::agent {

// The fetch is no longer needed (its round is over, the device stops); a later one resumes.
struct FetchEnded : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The artifact cannot be had (refused, corrupt, the deadline): the round fails with this reason.
struct FetchFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Fetcher {
 public:
  Fetcher(Link& link, LogFn log, double stall_s = 5, double resend_after_s = 60, double group_wait_s = 15)
      : link_(link), log_(std::move(log)), stall_s_(stall_s), resend_after_s_(resend_after_s),
        group_wait_s_(group_wait_s) {}
  void assign(const std::map<std::string, std::string>& shared) {   // a new instruction: what its group shares
    shared_ = shared;
    silent_.clear();
  }
  std::string fetch(const std::string& artifact, double timeout_s);
  // The set's folder (cache/artifacts/<id>), `into` for a prefix.
  std::string fetch_artifact(const std::string& artifact, double timeout_s, const std::string& into = "");
  int64_t corrupt_chunks = 0;

 private:
  void check();
  void want(PartialArtifact& part, bool resend);
  PartialArtifact::Verdict on_chunk(PartialArtifact& part, int64_t seq, const std::string& data, bool acknowledge);
  Link& link_;
  LogFn log_;
  double stall_s_, resend_after_s_, group_wait_s_;
  std::map<std::string, std::string> shared_;
  std::set<std::string> silent_;
};

}  // namespace edgefl::agent
