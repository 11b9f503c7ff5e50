// Float32 matrix products for edgefl's kernels: Eigen's GEMM, compiled for the instruction set the trainer was
// built for (CMakeLists.txt: EDGEFL_CPU_LEVEL) and, in an x86 build below x86-64-v4, for AVX-512 as well, run
// where the CPU has it (gemm.cpp). The wheel's kernels run Eigen's GEMM too, but built for the x86-64 baseline
// (SSE2, no FMA): 25 GFLOP/s on a 1024x288 by 288x64 product here, against 70 with AVX2 + FMA and 112 with
// AVX-512 from the same source.
#pragma once

#include <cstdint>

namespace edgefl {

// A row-major matrix operand: `rows` x `cols` as the product reads it; `transposed`: stored as its transpose
// (cols x rows, row-major), so a transpose costs no copy.
struct Operand {
  const float* data;
  int64_t rows, cols;
  bool transposed = false;
};

// c (a.rows x b.cols, row-major, dense) = a . b, or += with `accumulate`; c may not overlap a or b.
void gemm(const Operand& a, const Operand& b, float* c, bool accumulate = false);

// The common case: c (m x n) = a (m x k) . b (k x n), all dense row-major.
inline void gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  gemm(Operand{a, m, k}, Operand{b, k, n}, c);
}

// gemm_rows' column count must be a multiple of this (whole vectors of every instruction set it is built for).
constexpr int64_t kRowsMultiple = 16;

// c (m x n, row-major, dense) = a (m x k, row-major) . B (k x n), where row r of B is the n floats from
// b + offsets[r]: rows of one buffer read where they lie (a stride-1 convolution's shifted input rows,
// gemm_rows.cpp). n a multiple of kRowsMultiple.
void gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, const float* b, const int64_t* offsets, float* c);

// The positions a product sums over: `rows` runs of `run` consecutive positions, `stride` apart (a convolution's
// output rows at its padded input's width: the pad columns' positions are skipped, not summed as zeros).
struct Positions {
  int64_t rows, run, stride;
};

// c (m x n, row-major, dense) = A (m x K) . b (K x n, row-major), or += with `accumulate`, summed over the positions
// p of k, where A[r][p] is a[offsets[r] + p] and row p of b starts at b + p * n (a stride-1 convolution's weight
// gradient, transposed: the shifted input rows against the output's gradient laid out position by channel). n a
// multiple of kRowsMultiple.
void gemm_rows_left(int64_t m, int64_t n, Positions k, const float* a, const int64_t* offsets, const float* b, float* c,
                    bool accumulate);

// The instruction set gemm runs on this CPU ("x86-64-v4", "x86-64-v3", "armv8-a", ...), for the trainer's report.
const char* gemm_cpu_level();

}  // namespace edgefl
