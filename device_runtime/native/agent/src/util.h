// Small helpers the agent's parts share: the log, files, hashes, clocks, this process's memory.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "edgefl_device.h"

namespace edgefl::agent {

// A mistake the user can fix: one line naming the thing and the fix (edgefl-device: error: ..., exit 2).
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using LogFn = std::function<void(int level, const std::string& line)>;

double now_s();                                   // monotonic seconds
std::string random_hex(size_t bytes);             // from /dev/urandom
std::string sha256_hex(const std::string& data);
std::string sha256_file(const std::string& path); // "" when unreadable
bool read_file(const std::string& path, std::string& out);
bool write_file(const std::string& path, const std::string& data);  // via a temporary file and rename
bool is_file(const std::string& path);
bool make_dirs(const std::string& path);
void remove_tree(const std::string& path);
std::string parent_of(const std::string& path);
std::string absolute(const std::string& path);
int64_t vm_status(const char* field);             // /proc/self/status VmRSS / VmHWM in bytes (0 elsewhere)
int64_t vm_status_of(int pid, const char* field);
std::string format_double(double v);              // the shortest text that reads back as v (Python's repr)

}  // namespace edgefl::agent
