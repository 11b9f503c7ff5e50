// Whether this CPU runs the instruction-set level the trainer was compiled for (EDGEFL_CPU_LEVEL). Compiled for
// the architecture's baseline (cpu_level.cpp): callable before any code built for the level runs.
#pragma once

extern "C" __attribute__((visibility("default"))) bool edgefl_cpu_has_level();
