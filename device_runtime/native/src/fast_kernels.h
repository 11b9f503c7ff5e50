#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace edgefl {

// Registers edgefl's float32 kernels (products, copies, reductions) ahead of the shipped ones (fast_kernels.cpp
// says how and why); call before loading a program. False where the shipped kernels to fall back on are
// missing (then nothing is registered).
bool register_fast_kernels();

// Registers what every program needs from edgefl whatever kernels serve the rest: its fix of a shipped kernel
// that computes wrong results, the max pool's backward (kernels_pool.cpp), and its own operators, batch norm
// and its backward (kernels_norm.cpp). False where the shipped kernel is missing.
bool register_fixes();

// How many calls each of those kernels served itself so far (the rest went to the shipped kernel).
std::vector<std::pair<std::string, uint64_t>> fast_kernel_calls();

}  // namespace edgefl
