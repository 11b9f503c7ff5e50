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

// Registers edgefl's fixes of shipped kernels that compute wrong results: the max pool's backward
// (kernels_pool.cpp), whatever kernels serve the rest. False where the shipped kernel is missing.
bool register_fixes();

// How many calls each of those kernels served itself so far (the rest went to the shipped kernel).
std::vector<std::pair<std::string, uint64_t>> fast_kernel_calls();

}  // namespace edgefl
