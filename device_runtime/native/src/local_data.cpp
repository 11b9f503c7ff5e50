#include "local_data.h"

#include <cmath>
#include <sys/stat.h>

#include "errors.h"

namespace edgefl {
namespace {

std::string shape_text(const std::vector<int64_t>& shape, size_t from) {
  std::string out = "(";
  for (size_t i = from; i < shape.size(); i++) out += (i > from ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() - from == 1 ? ",)" : ")");
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

LocalData::LocalData(const std::string& path, const ArtifactSet& set) {
  NpyArray x, y;
  if (is_dir(path)) {
    x_name_ = path + "/x.npy";
    y_name_ = path + "/y.npy";
    struct stat st {};
    for (const std::string& f : {x_name_, y_name_})
      if (stat(f.c_str(), &st) != 0)
        throw UserError("--data " + path + ": " + f.substr(f.rfind('/') + 1) +
                        " not found; give a folder with x.npy and y.npy or an .npz (write one with 'edgefl data export')");
    x = npy_open(x_name_);
    y = npy_open(y_name_);
  } else {
    auto members = npz_open(path);
    for (const char* key : {"x", "y"})
      if (!members.count(key))
        throw UserError("--data " + path + ": no array '" + key + "'; the .npz must hold arrays x and y");
    x = members["x"];
    y = members["y"];
    x_name_ = path + ":x";
    y_name_ = path + ":y";
  }
  const IOSpec& input = set.model_input();
  examples_ = x.shape.empty() ? 0 : x.shape[0];
  int64_t targets = 1;
  for (int64_t d : y.shape) targets *= d;
  if (examples_ == 0 || targets % examples_ != 0)
    throw UserError("--data " + path + ": x has " + std::to_string(examples_) + " examples and y " +
                    std::to_string(targets) + " targets; y needs a whole number of targets per example");
  targets_per_example_ = targets / examples_;
  int64_t program_targets = 1;  // the labels input of the training program: the batch's targets
  for (int64_t d : set.suffix.inputs.back().shape) program_targets *= d;
  if (set.suffix.batch > 0 && targets_per_example_ != program_targets / set.suffix.batch)
    throw UserError(y_name_ + ": " + std::to_string(targets_per_example_) + " targets per example, the artifact "
                    "trains on " + std::to_string(program_targets / set.suffix.batch) + "; export data for this model");
  std::vector<int64_t> want(input.shape.begin() + 1, input.shape.end());
  std::vector<int64_t> got(x.shape.begin() + 1, x.shape.end());
  if (want != got)
    throw UserError(x_name_ + ": examples of shape " + shape_text(x.shape, 1) + ", the artifact takes " +
                    shape_text(input.shape, 1) + "; export data for this model");
  for (int64_t d : got) values_per_example_ *= static_cast<size_t>(d);
  input_dtype_ = input.dtype;
  x_descr_ = x.descr;
  y_descr_ = y.descr;
  y.shape = {examples_, targets_per_example_};  // targets read per example, however y was shaped
  x_ = std::make_unique<RowReader>(x);
  y_ = std::make_unique<RowReader>(y);

  // Targets are checked once, in bounded chunks: a label out of range would train on garbage.
  const int64_t chunk = 4096;
  std::vector<int64_t> rows, labels;
  std::vector<unsigned char> raw;
  for (int64_t start = 0; start < examples_; start += chunk) {
    const int64_t n = std::min(chunk, examples_ - start);
    rows.resize(n);
    for (int64_t i = 0; i < n; i++) rows[i] = start + i;
    raw.resize(n * y_->row_bytes());
    y_->read_rows(rows.data(), rows.size(), raw.data());
    labels.resize(n * targets_per_example_);
    convert_rows(y_descr_, raw.data(), labels.size(), "int64", labels.data());
    for (size_t i = 0; i < labels.size(); i++)
      if (labels[i] != -100 && (labels[i] < 0 || labels[i] >= set.classes))
        throw UserError(y_name_ + ": target " + std::to_string(labels[i]) + " of example " +
                        std::to_string(start + static_cast<int64_t>(i) / targets_per_example_) +
                        " is outside the model's " + std::to_string(set.classes) +
                        " classes; give labels 0.." + std::to_string(set.classes - 1) + " (-100 to ignore one)");
  }
}

void LocalData::gather(const std::vector<int64_t>& indices, std::vector<unsigned char>& x, std::vector<int64_t>& y) {
  std::vector<unsigned char> raw(indices.size() * x_->row_bytes());
  x_->read_rows(indices.data(), indices.size(), raw.data());
  const size_t values = indices.size() * values_per_example_;
  x.resize(values * (input_dtype_ == "int64" ? 8 : 4));
  convert_rows(x_descr_, raw.data(), values, input_dtype_, x.data());
  if (input_dtype_ == "float32") {
    const float* f = reinterpret_cast<const float*>(x.data());
    for (size_t i = 0; i < values; i++)
      if (!std::isfinite(f[i]))
        throw UserError(x_name_ + ": example " + std::to_string(indices[i / values_per_example_]) +
                        " holds NaN or infinity; clean the data before training");
  }
  raw.resize(indices.size() * y_->row_bytes());
  y_->read_rows(indices.data(), indices.size(), raw.data());
  y.resize(indices.size() * targets_per_example_);
  convert_rows(y_descr_, raw.data(), y.size(), "int64", y.data());
}

}  // namespace edgefl
