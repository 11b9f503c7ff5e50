// A device's local data, read a batch at a time: x.npy + y.npy in a folder, or an .npz holding x and y
// (edgefl data export writes one). Only the rows of the batch at hand are ever in memory, so the
// training peak does not grow with the size of the device's share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "artifact_set.h"
#include "npy.h"

namespace edgefl {

class LocalData {
 public:
  // Opens the data and checks it against the set: example shape, and every target in [0, classes) or
  // -100 (ignored). Throws UserError naming the file and the fix.
  LocalData(const std::string& path, const ArtifactSet& set);

  int64_t examples() const { return examples_; }
  int64_t targets_per_example() const { return targets_per_example_; }

  // The rows `indices` of x converted to the model input's dtype, and their targets as int64.
  void gather(const std::vector<int64_t>& indices, std::vector<unsigned char>& x, std::vector<int64_t>& y);

 private:
  std::string x_name_, y_name_, input_dtype_;
  std::unique_ptr<RowReader> x_, y_;
  std::string x_descr_, y_descr_;
  int64_t examples_ = 0, targets_per_example_ = 1;
  size_t values_per_example_ = 1;
};

}  // namespace edgefl
