#include "util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sha256.h"

namespace edgefl::agent {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(&raw[0], static_cast<std::streamsize>(bytes));
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string sha256_hex(const std::string& data) { return edgefl::sha256_hex(data.data(), data.size()); }

std::string sha256_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  edgefl::Sha256 h;
  std::string block(1 << 16, '\0');
  ssize_t n;
  while ((n = read(fd, &block[0], block.size())) > 0) h.update(block.data(), static_cast<size_t>(n));
  close(fd);
  return n < 0 ? "" : h.hex_digest();
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  out = s.str();
  return true;
}

bool write_file(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f.write(data.data(), static_cast<std::streamsize>(data.size()))) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool make_dirs(const std::string& path) {
  if (path.empty()) return true;
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  if (!make_dirs(parent_of(path))) return false;
  return mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) remove_tree(path + "/" + e->d_name);
      closedir(d);
    }
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
}

std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  return getcwd(cwd, sizeof cwd) ? std::string(cwd) + "/" + path : path;
}

int64_t vm_status_of(int pid, const char* field) {
  std::ifstream status(pid ? "/proc/" + std::to_string(pid) + "/status" : std::string("/proc/self/status"));
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(status, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::atoll(line.c_str() + n + 1) * 1024;
  return 0;
}

int64_t vm_status(const char* field) { return vm_status_of(0, field); }

std::string format_double(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  // Python's repr writes a float with a point or an exponent ("0.05", "1.0", "1e-05"): the trainer reads either
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace edgefl::agent
