// Fuzz target: an .npz archive (a device's data, the state.npz of a set), parsed as npz_open parses
// it, then each member's first values converted as the trainer converts rows. Bad bytes must end in a
// UserError, nothing else.
#include <cstddef>
#include <cstdint>

#include "errors.h"
#include "fuzz/npy_values.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    for (const auto& member : edgefl::npz_parse(data, size, "data.npz")) convert_some(member.second, data);
  } catch (const edgefl::UserError&) {
  }
  return 0;
}
