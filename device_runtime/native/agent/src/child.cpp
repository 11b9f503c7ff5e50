#include "child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util.h"

extern char** environ;

namespace edgefl::agent {
namespace {

const char* const CGROUP_ROOT = "/sys/fs/cgroup";

std::string own_v1_memory_cgroup() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find(",memory,") != std::string::npos) return std::string(CGROUP_ROOT) + "/memory" + line.substr(b + 1);
  }
  return "";
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  return static_cast<bool>(f << text << std::flush);
}

std::string last_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

}  // namespace

MemoryCap::MemoryCap(int64_t limit_bytes, const std::string& name) : limit_(limit_bytes) {
  const std::string v2 = CGROUP_ROOT, v1 = own_v1_memory_cgroup();
  const std::pair<std::string, std::string> candidates[] = {{v2, "memory.max"}, {v1, "memory.limit_in_bytes"}};
  for (const auto& [parent, limit_file] : candidates) {
    if (parent.empty() || !is_file(parent + "/" + (limit_file == "memory.max" ? "cgroup.controllers" : limit_file)))
      continue;
    const std::string folder = parent + "/" + name + "-" + random_hex(4);
    if (mkdir(folder.c_str(), 0755) != 0) continue;
    if (!write_text(folder + "/" + limit_file, std::to_string(limit_))) {
      rmdir(folder.c_str());
      continue;
    }
    folder_ = folder;
    procs_ = folder + "/cgroup.procs";
    break;
  }
}

MemoryCap::~MemoryCap() {
  if (!folder_.empty()) rmdir(folder_.c_str());
}

bool MemoryCap::oom_killed() const {
  if (folder_.empty()) return false;
  for (const char* events : {"memory.events", "memory.oom_control"}) {
    std::ifstream f(folder_ + "/" + events);
    std::string key;
    int64_t value = 0;
    while (f >> key >> value)
      if (key == "oom_kill" && value > 0) return true;
  }
  return false;
}

std::string MemoryCap::describe() const {
  const size_t slash = folder_.find_last_of('/');
  return std::to_string(limit_) + " B (" + (folder_.empty() ? std::string("RLIMIT_AS") : "cgroup " + folder_.substr(slash + 1)) + ")";
}

ChildResult run_child(const std::vector<std::string>& argv, int threads, const MemoryCap* cap,
                      const std::function<bool()>& keep_going) {
  // everything the child needs is made before fork: between fork and exec it only makes system calls
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) {
    const std::string kv = *e;
    if (kv.rfind("MALLOC_", 0) == 0 || kv.rfind("GLIBC_TUNABLES=", 0) == 0 || kv.rfind("OMP_NUM_THREADS=", 0) == 0)
      continue;
    env.push_back(kv);
  }
  env.push_back("MALLOC_MMAP_THRESHOLD_=131072");   // edgefl.cost.measure.MMAP_THRESHOLD
  env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const std::string procs = cap ? cap->procs_file() : "";
  const rlim_t as_limit = cap ? static_cast<rlim_t>(cap->limit()) : 0;
  const pid_t parent = getpid();

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    return ChildResult{1, "", "cannot start the training process: no pipes", 0};
  const pid_t pid = fork();
  if (pid == 0) {
    if (!procs.empty()) {   // join the cap's cgroup before exec: everything the trainer allocates is accounted
      char text[32];
      const int n = std::snprintf(text, sizeof text, "%d\n", static_cast<int>(getpid()));
      const int fd = open(procs.c_str(), O_WRONLY);
      if (fd < 0 || write(fd, text, static_cast<size_t>(n)) != n) _exit(126);
      close(fd);
    } else if (cap) {
      struct rlimit r{as_limit, as_limit};
      setrlimit(RLIMIT_AS, &r);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);   // an agent killed outright takes its trainer with it
    if (getppid() != parent) _exit(1);  // it died before prctl: no signal would come
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    return ChildResult{1, "", "cannot start the training process: fork failed", 0};
  }
  std::string stdout_text, stderr_text;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  bool killed = false;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, 100) < 0 && errno != EINTR) break;
    for (auto& f : fds) {
      if (f.fd < 0 || !(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(f.fd, buf, sizeof buf);
      if (n <= 0) {
        close(f.fd);
        f.fd = -1;
        open_fds--;
        continue;
      }
      std::string& text = f.fd == out[0] ? stdout_text : stderr_text;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > (1u << 20)) text.erase(0, text.size() - (1u << 16));   // its tail is what counts
    }
    if (!killed && !keep_going()) {
      kill(pid, SIGKILL);
      killed = true;
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  ChildResult r;
  r.max_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;   // kB on Linux
  r.returncode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  const std::string err_line = last_line(stderr_text);
  if (r.returncode == 0) {
    r.result = last_line(stdout_text);
    if (r.result.empty() || r.result[0] != '{') {
      r.returncode = 1;
      r.error = "no result from the training process: " + err_line.substr(0, 500);
    }
    return r;
  }
  if (r.returncode == 2 && !err_line.empty()) {
    r.error = err_line;
    for (const char* prefix : {"edgefl-device: error: ", "edgefl-et-train: error: "})
      if (r.error.rfind(prefix, 0) == 0) r.error = r.error.substr(std::strlen(prefix));
    return r;
  }
  if (r.returncode == 127 && stderr_text.empty()) r.error = "training process: cannot run " + argv[0];
  else
    r.error = "training process " + (r.returncode < 0 ? "killed by signal " + std::to_string(-r.returncode)
                                                      : "exit " + std::to_string(r.returncode)) +
              ": " + err_line.substr(err_line.size() > 300 ? err_line.size() - 300 : 0);
  return r;
}

}  // namespace edgefl::agent
