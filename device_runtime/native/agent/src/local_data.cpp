#include "local_data.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "util.h"

namespace edgefl::agent {
namespace {

const char* const HINT = "give a folder with x.npy and y.npy or an .npz (write one with 'edgefl data export')";
const int64_t IGNORE_INDEX = -100;     // a target that counts for nothing (language-model padding)

struct Npy {
  std::string path, descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  char kind() const { return descr.size() > 1 ? descr[1] : '?'; }
  int itemsize() const { return descr.size() > 2 ? std::atoi(descr.c_str() + 2) : 0; }
  std::string dtype() const {   // numpy's name of it
    const int bits = 8 * itemsize();
    switch (kind()) {
      case 'f': return "float" + std::to_string(bits);
      case 'i': return "int" + std::to_string(bits);
      case 'u': return "uint" + std::to_string(bits);
      case 'b': return "bool";
      default: return descr;
    }
  }
};

std::string tuple(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); i++) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// The value of `key` in an .npy header dict: from after its colon.
size_t after_key(const std::string& header, const char* key) {
  const size_t at = header.find(std::string("'") + key + "'");
  if (at == std::string::npos) return at;
  const size_t colon = header.find(':', at);
  return colon == std::string::npos ? colon : colon + 1;
}

// The header of the .npy at `path` (nothing else is read), or why not.
std::string read_header(const std::string& path, Npy& out) {
  out.path = path;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return path + ": cannot be read (" + std::strerror(errno) + ")";
  char buf[65536];
  const ssize_t n = pread(fd, buf, sizeof buf, 0);
  close(fd);
  const std::string again = "; write it with numpy.save, or 'edgefl data export'";
  if (n < 10 || std::memcmp(buf, "\x93NUMPY", 6) != 0) return path + ": not an .npy file" + again;
  const unsigned major = static_cast<unsigned char>(buf[6]);
  size_t len = static_cast<unsigned char>(buf[8]) | static_cast<unsigned char>(buf[9]) << 8, start = 10;
  if (major >= 2) {
    if (n < 12) return path + ": a cut .npy header" + again;
    len = 0;
    for (int i = 3; i >= 0; i--) len = len << 8 | static_cast<unsigned char>(buf[8 + i]);
    start = 12;
  }
  if (start + len > static_cast<size_t>(n)) return path + ": a cut .npy header" + again;
  const std::string header(buf + start, len);
  out.offset = static_cast<int64_t>(start + len);
  size_t at = after_key(header, "descr");
  const size_t q = at == std::string::npos ? at : header.find_first_of("'\"", at);
  const size_t e = q == std::string::npos ? q : header.find(header[q], q + 1);
  if (e == std::string::npos) return path + ": an .npy header without its dtype" + again;
  out.descr = header.substr(q + 1, e - q - 1);
  at = after_key(header, "fortran_order");
  out.fortran = at != std::string::npos && header.compare(header.find_first_not_of(' ', at), 4, "True") == 0;
  at = after_key(header, "shape");
  const size_t open_ = at == std::string::npos ? at : header.find('(', at);
  const size_t close_ = open_ == std::string::npos ? open_ : header.find(')', open_);
  if (close_ == std::string::npos) return path + ": an .npy header without its shape" + again;
  const std::string dims = header.substr(open_ + 1, close_ - open_ - 1);
  for (size_t i = 0; i < dims.size();) {
    const size_t j = std::min(dims.find(',', i), dims.size());
    const std::string d = dims.substr(i, j - i);
    if (d.find_first_not_of(" ") != std::string::npos) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (v < 0 || end == d.c_str()) return path + ": an .npy header with shape (" + dims + ")" + again;
      out.shape.push_back(v);
    }
    i = j + 1;
  }
  if (out.fortran) return path + ": stored in Fortran order; save a C-ordered array (numpy.save of np.ascontiguousarray)";
  if (out.descr.size() < 3 || (out.descr[0] == '>' && out.itemsize() > 1))
    return path + ": values of dtype " + out.descr + "; save it little-endian, as 'edgefl data export' does";
  return "";
}

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); i++) p *= v[i];
  return p;
}

// What the set trains on (device_runtime/local_data.py ModelInput.of): its first program's first input, the
// targets per example and the classes of its logits.
struct ModelInput {
  std::optional<std::vector<int64_t>> row;   // nothing: a dimension the manifest leaves open
  std::string dtype;
  int64_t targets = 1;
  std::optional<int64_t> classes;
};

std::optional<std::vector<int64_t>> ints(const nlohmann::json& shape, size_t from) {
  if (!shape.is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (size_t i = from; i < shape.size(); i++) {
    if (!shape[i].is_number_integer()) return std::nullopt;
    out.push_back(shape[i].get<int64_t>());
  }
  return out;
}

std::optional<ModelInput> model_input(const std::string& set_folder) {
  std::string text;
  if (!read_file(set_folder + "/manifest.json", text)) return std::nullopt;
  const auto suffix = nlohmann::json::parse(text, nullptr, false);
  auto first = suffix;
  if (read_file(set_folder + "/prefix/manifest.json", text)) first = nlohmann::json::parse(text, nullptr, false);
  try {
    ModelInput m;
    const auto& input = first.at("inputs").at(0);
    m.row = ints(input.at("shape"), 1);
    m.dtype = input.at("dtype").get<std::string>();
    const auto labels = ints(suffix.at("inputs").back().at("shape"), 0);
    const int64_t batch = suffix.value("batch_size", nlohmann::json()).is_number_integer() ? suffix["batch_size"].get<int64_t>() : 0;
    if (labels && batch > 0) m.targets = product(*labels) / batch;
    else m.targets = m.row && m.dtype.rfind("int", 0) == 0 ? product(*m.row) : 1;
    const auto& outputs = suffix.at("outputs");
    if (outputs.size() > 1) {
      const auto logits = ints(outputs.at(1).at("shape"), 0);
      if (logits && !logits->empty()) m.classes = logits->back();
    }
    return m;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;     // a manifest the trainer will refuse with its own reason
  }
}

// Every target an integer in 0..classes-1 (>= 0 without classes) or the ignore index; reads y a block at a time.
std::string check_labels(const Npy& y, int64_t per_example, std::optional<int64_t> classes) {
  if (y.kind() != 'i' && y.kind() != 'u')
    return y.path + ": labels of dtype " + y.dtype() + "; labels are class indices: save y as int64";
  const int size = y.itemsize();
  if (size != 1 && size != 2 && size != 4 && size != 8) return "";
  const int fd = open(y.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return y.path + ": cannot be read (" + std::strerror(errno) + ")";
  const int64_t total = product(y.shape);
  std::vector<unsigned char> block(static_cast<size_t>(size) * 8192);
  std::string why;
  for (int64_t first = 0; first < total && why.empty(); first += 8192) {
    const int64_t count = std::min<int64_t>(8192, total - first);
    const ssize_t n = pread(fd, block.data(), static_cast<size_t>(count * size), y.offset + first * size);
    if (n != count * size) {
      why = y.path + ": cut short (" + std::to_string(total) + " targets in its header); write it again";
      break;
    }
    for (int64_t i = 0; i < count; i++) {
      uint64_t raw = 0;
      for (int b = size - 1; b >= 0; b--) raw = raw << 8 | block[static_cast<size_t>(i * size + b)];
      int64_t v = static_cast<int64_t>(raw);
      if (y.kind() == 'i' && size < 8 && (raw >> (8 * size - 1)) & 1) v -= int64_t{1} << (8 * size);
      if (v == IGNORE_INDEX || (v >= 0 && (!classes || v < *classes))) continue;
      const std::string where = y.path + ": target " + std::to_string(v) + " of example " +
                                std::to_string((first + i) / per_example);
      why = !classes ? where + " is negative; give class indices from 0 (-100 to ignore one)"
                     : where + " is outside the model's " + std::to_string(*classes) + " classes; give labels 0.." +
                           std::to_string(*classes - 1) + " (-100 to ignore one)";
      break;
    }
  }
  close(fd);
  return why;
}

}  // namespace

std::string check_local_data(const std::string& data, const std::string& set_folder) {
  if (is_file(data)) {      // an .npz: the trainer reads its members
    char magic[2] = {0, 0};
    const int fd = open(data.c_str(), O_RDONLY | O_CLOEXEC);
    const bool zip = fd >= 0 && pread(fd, magic, 2, 0) == 2 && magic[0] == 'P' && magic[1] == 'K';
    if (fd >= 0) close(fd);
    return zip ? "" : "--data " + data + ": not an .npz archive; " + HINT;
  }
  Npy x, y;
  for (auto [npy, name] : {std::pair<Npy*, const char*>{&x, "x.npy"}, {&y, "y.npy"}}) {
    const std::string path = data + "/" + name;
    if (!is_file(path)) return "--data " + data + ": " + name + " not found; " + HINT;
    if (auto why = read_header(path, *npy); !why.empty()) return why;
  }
  const int64_t rows = x.shape.empty() ? 0 : x.shape[0], targets = product(y.shape);
  if (rows == 0) return "--data " + x.path + ": no examples (x has 0 rows); a device trains on at least one: " + HINT;
  if (targets % rows)
    return y.path + ": x has " + std::to_string(rows) + " examples and y " + std::to_string(targets) +
           " targets; y needs a whole number of targets per example";
  if (y.shape.size() > 1 && y.shape[0] != rows)
    return y.path + ": " + std::to_string(y.shape[0]) + " rows of targets, x has " + std::to_string(rows) +
           " examples; give y one row of targets per example of x";
  const int64_t per_example = targets / rows;
  const auto model = model_input(set_folder);
  if (!model) return "";
  const std::vector<int64_t> row(x.shape.begin() + 1, x.shape.end());
  if (model->row && row != *model->row)
    return x.path + ": examples of shape " + tuple(row) + ", the artifact takes " + tuple(*model->row) +
           "; export data for this model";
  if (x.kind() != 'f' && x.kind() != 'i' && x.kind() != 'u')
    return x.path + ": values of dtype " + x.dtype() + "; save x as float32 (images, features) or int64 (token ids), "
           "as 'edgefl data export' does";
  if (model->dtype.rfind("float", 0) == 0 && x.kind() != 'f')
    return x.path + ": " + x.dtype() + " values, the model takes " + model->dtype + " inputs; convert them as 'edgefl "
           "data export' writes them (uint8 images: x.astype('float32') / 255)";
  if (model->dtype.rfind("int", 0) == 0 && x.kind() == 'f')
    return x.path + ": " + x.dtype() + " values, the model takes " + model->dtype + " token ids; save x as int64";
  if (per_example != model->targets)
    return y.path + ": " + std::to_string(per_example) + " targets per example of x, the model trains on " +
           std::to_string(model->targets) + "; give y of shape " +
           (model->targets == 1 ? "(" + std::to_string(rows) + ",)"
                                : "(" + std::to_string(rows) + ", " + std::to_string(model->targets) + ")");
  return check_labels(y, per_example, model->classes);
}

}  // namespace edgefl::agent
