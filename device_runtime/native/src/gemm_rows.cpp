// gemm.h's gemm_rows and gemm_rows_left: products one of whose operands is rows read in place, each at its own
// offset into one buffer. A stride-1 convolution's patch matrix is its padded input read at k*k shifts per
// channel; reading those rows where they lie saves writing the matrix (9x the input for a 3x3 kernel) and Eigen's
// packing of it. gemm_rows serves the convolution and its input's gradient (the shifted rows on the right),
// gemm_rows_left its weight's gradient (on the left). Compiled like gemm_eigen.cpp: once at the trainer's level
// and, on x86 below x86-64-v4, once for AVX-512 (namespace edgefl::gemm_avx512), which gemm.cpp runs where the
// CPU has it.
//
// A block of rows by vectors of columns of c stays in registers over the whole of k: each step loads one
// operand's vectors and broadcasts the other's elements from memory, one fused multiply-add per pair. The sum
// over k runs in order, one fused multiply-add a term (this file is compiled with contraction on).
#ifdef EDGEFL_GEMM_AVX512
#define EDGEFL_GEMM_NAMESPACE gemm_avx512
#else
#define EDGEFL_GEMM_NAMESPACE gemm_build
#endif

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gemm.h"

namespace edgefl::EDGEFL_GEMM_NAMESPACE {

namespace {

#if defined(__AVX512F__)
constexpr int V = 16;
#elif defined(__AVX__)
constexpr int V = 8;
#else
constexpr int V = 4;  // SSE2, NEON
#endif
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int REGISTERS = 32;
#else
constexpr int REGISTERS = 16;
#endif
typedef float Vec __attribute__((vector_size(V * sizeof(float))));
// an unaligned vector: the shifted rows start anywhere
typedef float Loose __attribute__((vector_size(V * sizeof(float)), aligned(sizeof(float))));
// MR x NV accumulators within the vector registers: 12 of 16 on SSE2 and AVX2, 24 of 32 on AVX-512 and NEON
constexpr int MR = REGISTERS == 32 ? 8 : 4;
constexpr int NV = 3;
static_assert(kRowsMultiple % V == 0, "gemm_rows' column multiple must be whole vectors");

// x in every lane: one broadcast (x - 0 is x for every x, so it folds away; 0 + x is not, -0 + 0 being +0)
inline Vec splat(float x) { return x - Vec{}; }

template <int M, int N>
void block(int64_t k, const float* packed, const float* b, const int64_t* offsets, int64_t p, float* c,
           int64_t ldc) {
  Vec acc[M][N] = {};
  for (int64_t r = 0; r < k; r++) {
    const float* row = b + offsets[r] + p;
    Vec right[N];
    for (int j = 0; j < N; j++) right[j] = *reinterpret_cast<const Loose*>(row + j * V);
    for (int i = 0; i < M; i++) {
      const Vec left = splat(packed[r * M + i]);
      for (int j = 0; j < N; j++) acc[i][j] += left * right[j];
    }
  }
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) *reinterpret_cast<Loose*>(c + i * ldc + p + j * V) = acc[i][j];
}

// rows [row, row + M) of c, every column
template <int M>
void rows_of(int64_t row, int64_t n, int64_t k, const float* a, const float* b, const int64_t* offsets,
             float* c) {
  thread_local std::vector<float> packed;
  if (static_cast<int64_t>(packed.size()) < M * k) packed.resize(static_cast<size_t>(M * k));
  for (int64_t r = 0; r < k; r++)
    for (int i = 0; i < M; i++) packed[r * M + i] = a[(row + i) * k + r];
  float* out = c + row * n;
  int64_t p = 0;
  for (; p + NV * V <= n; p += NV * V) block<M, NV>(k, packed.data(), b, offsets, p, out, n);
  if (p + 2 * V <= n) block<M, 2>(k, packed.data(), b, offsets, p, out, n), p += 2 * V;
  for (; p < n; p += V) block<M, 1>(k, packed.data(), b, offsets, p, out, n);
}

// rows [r0, r0 + M) of c (+)= their shifted rows of A . b, N vectors of c's columns from column q: each step
// broadcasts one element of each of the M rows and loads N vectors of one row of b; the positions between runs
// (a convolution's pad columns, whose gradient is zero) are not visited. The loop vectorizer is kept
// off: it turned the rows' elements, read one position a step, into vectors of positions whose lanes it then
// broadcast one by one (3.7x slower).
template <int M, int N>
__attribute__((optimize("no-tree-vectorize"))) void left_block(Positions k, const float* a, const int64_t* offsets,
                                                               int64_t r0, const float* b, int64_t ldb, int64_t q,
                                                               float* c, bool accumulate) {
  Vec acc[M][N];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      acc[i][j] = accumulate ? *reinterpret_cast<const Loose*>(c + (r0 + i) * ldb + q + j * V) : Vec{};
  const float* rows[M];
  for (int i = 0; i < M; i++) rows[i] = a + offsets[r0 + i];
  for (int64_t y = 0; y < k.rows; y++)
    for (int64_t p = y * k.stride, end = p + k.run; p < end; p++) {
      Vec right[N];
      for (int j = 0; j < N; j++) right[j] = *reinterpret_cast<const Loose*>(b + p * ldb + q + j * V);
#pragma GCC unroll 8
      for (int i = 0; i < M; i++) {
        const Vec left = splat(rows[i][p]);
        for (int j = 0; j < N; j++) acc[i][j] += left * right[j];
      }
    }
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) *reinterpret_cast<Loose*>(c + (r0 + i) * ldb + q + j * V) = acc[i][j];
}

// every row of c, N vectors of columns from q, MR rows at a time: their MR row pointers stay in registers with the
// accumulators (more rows would read each pointer from memory before its element: two loads a multiply-add)
template <int N>
void left_columns(int64_t m, Positions k, const float* a, const int64_t* offsets, const float* b, int64_t n, int64_t q,
                  float* c, bool accumulate) {
  constexpr int M = MR;
  int64_t r = 0;
  for (; r + M <= m; r += M) left_block<M, N>(k, a, offsets, r, b, n, q, c, accumulate);
  for (; r < m; r++) left_block<1, N>(k, a, offsets, r, b, n, q, c, accumulate);
}

}  // namespace

void gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, const float* b, const int64_t* offsets, float* c) {
  int64_t row = 0;
  for (; row + MR <= m; row += MR) rows_of<MR>(row, n, k, a, b, offsets, c);
  if (MR > 4 && row + 4 <= m) rows_of<4>(row, n, k, a, b, offsets, c), row += 4;
  if (row + 2 <= m) rows_of<2>(row, n, k, a, b, offsets, c), row += 2;
  if (row < m) rows_of<1>(row, n, k, a, b, offsets, c);
}

void gemm_rows_left(int64_t m, int64_t n, Positions k, const float* a, const int64_t* offsets, const float* b, float* c,
                    bool accumulate) {
  int64_t q = 0;
  for (; q + NV * V <= n; q += NV * V) left_columns<NV>(m, k, a, offsets, b, n, q, c, accumulate);
  if (q + 2 * V <= n) left_columns<2>(m, k, a, offsets, b, n, q, c, accumulate), q += 2 * V;
  for (; q < n; q += V) left_columns<1>(m, k, a, offsets, b, n, q, c, accumulate);
}

}  // namespace edgefl::EDGEFL_GEMM_NAMESPACE
