// libedgefl_et_kernels.so: edgefl's kernels for a process that runs ExecuTorch's Python bindings (the Python
// ExecuTorch trainer, edgefl.device_runtime.trainers.executorch_trainer), which share the runtime library and its
// kernel registry with this one. Loaded with ctypes after the bindings; edgefl_cpu_has_level() first.
#include <cstdint>

#include "fast_kernels.h"
#include "gemm.h"

#define EXPORTED extern "C" __attribute__((visibility("default")))

EXPORTED bool edgefl_register_kernels() { return edgefl::register_fixes() && edgefl::register_fast_kernels(); }

EXPORTED const char* edgefl_kernels_cpu_level() { return EDGEFL_CPU_LEVEL; }

// the instruction set its matrix products run on this CPU (above the build's level where the CPU has AVX-512)
EXPORTED const char* edgefl_kernels_gemm_level() { return edgefl::gemm_cpu_level(); }

// calls edgefl's kernel for `op` (a name of fast_kernel_calls: "convolution", "bmm", ...) served so far
EXPORTED uint64_t edgefl_kernel_calls(const char* op) {
  for (const auto& [name, calls] : edgefl::fast_kernel_calls())
    if (name == op) return calls;
  return 0;
}
