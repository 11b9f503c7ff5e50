// The trainer is compiled for EDGEFL_CPU_LEVEL (CMakeLists.txt); on a CPU without it the first vector instruction
// would kill it with SIGILL and no word why. This file is compiled for the architecture's baseline, and checks
// from the program's preinit array: before any initializer runs, the shared libraries' included (they may call
// inline functions the trainer defines, compiled for the level).
#include <unistd.h>

#include <cstring>

#include "cpu_level.h"

namespace {

void refuse_a_cpu_without_the_level() {
  if (edgefl_cpu_has_level()) return;
  const char* parts[] = {"edgefl-et-train: this trainer was built for ", EDGEFL_CPU_LEVEL,
                         " CPUs and this CPU lacks that level (v2: SSE4.2, v3: AVX2 and FMA, v4: AVX-512); rebuild it for this "
                         "CPU with 'EDGEFL_CPU_LEVEL=x86-64 edgefl-device build-native' and keep EDGEFL_CPU_LEVEL "
                         "set where edgefl-device runs\n"};
  for (const char* part : parts) {
    ssize_t ignored = write(2, part, std::strlen(part));
    (void)ignored;
  }
  _exit(2);
}

__attribute__((section(".preinit_array"), used)) void (*const check_first)() = refuse_a_cpu_without_the_level;

}  // namespace
