// Fuzz target: a .npy file (a device's x.npy / y.npy), parsed as npy_open parses it, then its first
// values converted as the trainer converts rows. Bad bytes must end in a UserError, nothing else.
#include <cstddef>
#include <cstdint>

#include "errors.h"
#include "fuzz/npy_values.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    convert_some(edgefl::npy_parse(data, size, "x.npy"), data);
  } catch (const edgefl::UserError&) {
  }
  return 0;
}
