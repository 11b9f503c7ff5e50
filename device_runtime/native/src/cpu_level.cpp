#include "cpu_level.h"

extern "C" bool edgefl_cpu_has_level() {
#if defined(__x86_64__)
  __builtin_cpu_init();    // may run before the constructors that would have done it
  return __builtin_cpu_supports(EDGEFL_CPU_LEVEL);
#else
  return true;    // aarch64: the level is armv8-a, which every arm64 CPU runs
#endif
}
