#include "et_log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <executorch/runtime/platform/platform.h>

namespace edgefl {
namespace {

std::mutex lock;
std::vector<std::string> lines;

}  // namespace

void et_log_clear() {
  std::lock_guard<std::mutex> guard(lock);
  lines.clear();
}

std::string et_log_missing_operators() {
  std::lock_guard<std::mutex> guard(lock);
  std::string out;
  for (const std::string& line : lines) {
    const size_t at = line.find("aten::");
    if (line.find("issing operator") == std::string::npos || at == std::string::npos) continue;
    std::string name = line.substr(at);
    name = name.substr(0, name.find_first_of(" \n,"));
    if (out.find(name) == std::string::npos) out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

}  // namespace edgefl

// Replaces the runtime's weak default, which prints every message to stderr.
extern "C" void et_pal_emit_log_message(et_timestamp_t, et_pal_log_level_t level, const char* filename,
                                        const char*, size_t line, const char* message, size_t length) {
  static const bool echo = std::getenv("EDGEFL_ET_LOG") != nullptr;
  std::lock_guard<std::mutex> guard(edgefl::lock);
  if (edgefl::lines.size() < 256) edgefl::lines.emplace_back(message, length);
  if (echo) std::fprintf(stderr, "[et %c %s:%zu] %.*s\n", static_cast<char>(level), filename, line,
                         static_cast<int>(length), message);
}
