// The training child of one round (device_runtime/child.py, memcap.py): the native trainer forked and exec'd
// with the allocator policy the cost model is calibrated for (MALLOC_MMAP_THRESHOLD_=131072) and one thread per
// core it is given, tied to this process's life (PR_SET_PDEATHSIG), optionally inside a memory cap (a cgroup of
// its own where this machine permits one, else RLIMIT_AS). Its peak comes from the kernel (wait4's ru_maxrss),
// so a child killed for memory still has a measured peak; its result is its last stdout line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace edgefl::agent {

class MemoryCap {
 public:
  MemoryCap(int64_t limit_bytes, const std::string& name);
  ~MemoryCap();
  MemoryCap(const MemoryCap&) = delete;
  MemoryCap& operator=(const MemoryCap&) = delete;
  bool oom_killed() const;
  std::string describe() const;
  int64_t limit() const { return limit_; }
  const std::string& procs_file() const { return procs_; }   // "" : RLIMIT_AS

 private:
  int64_t limit_;
  std::string folder_, procs_;
};

struct ChildResult {
  int returncode = 0;           // negative: killed by that signal
  std::string result;           // the last stdout line (a JSON object) when it succeeded
  std::string error;            // its one-line error, or what killed it
  int64_t max_rss_bytes = 0;
};

// Runs `argv` to its end; `keep_going()` is asked every 100 ms and a false kills the child (stopping, a round
// that is over).
ChildResult run_child(const std::vector<std::string>& argv, int threads, const MemoryCap* cap,
                      const std::function<bool()>& keep_going);

}  // namespace edgefl::agent
