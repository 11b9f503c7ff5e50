// What a reader does with a parsed array's data, for the .npy and .npz fuzz targets: convert its first
// values (at most 4096) to the two types the trainer reads, straight from the input buffer. A parser
// that let the data run past the buffer is caught by AddressSanitizer here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "errors.h"
#include "npy.h"

inline void convert_some(const edgefl::NpyArray& a, const uint8_t* data) {
  uint64_t count = 1;
  for (int64_t d : a.shape) count *= static_cast<uint64_t>(d);
  count = std::min<uint64_t>(count, 4096);
  std::vector<float> f(count);
  std::vector<int64_t> q(count);
  edgefl::convert_rows(a.descr, data + a.data_offset, count, "float32", f.data());
  try {
    edgefl::convert_rows(a.descr, data + a.data_offset, count, "int64", q.data());
  } catch (const edgefl::UserError&) {  // floats that are no labels
  }
}
