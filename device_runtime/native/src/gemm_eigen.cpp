// gemm.h's product, by Eigen. Compiled once at the trainer's level (namespace edgefl::gemm_build) and, on x86
// below x86-64-v4, once more for AVX-512 (namespace edgefl::gemm_avx512, CMakeLists.txt: edgefl_gemm_avx512),
// which gemm.cpp calls on a CPU that has it. Eigen's templates are renamed in that second copy: two copies of
// one template compiled for two instruction sets would be one symbol to the linker, which keeps either, and a
// CPU without AVX-512 would then run the wide one.
#ifdef EDGEFL_GEMM_AVX512
#define Eigen edgefl_eigen_avx512
#define EDGEFL_GEMM_NAMESPACE gemm_avx512
#else
#define EDGEFL_GEMM_NAMESPACE gemm_build
#endif

#include "gemm.h"

// Eigen packs each product's operands into blocks it allocates per call: on the stack up to this size, else on
// the heap, where a block above glibc's mmap threshold (128 KiB on a device: device_runtime/peaks.py) is a fresh
// mapping every call, its pages faulted in and zeroed by the kernel (4% of a CNN step under perf). Blocks are at
// most about the L2 cache's size: up to 1 MiB each stays on the stack, its pages touched once.
#define EIGEN_STACK_ALLOCATION_LIMIT (1 << 20)
#include <Eigen/Core>

namespace edgefl::EDGEFL_GEMM_NAMESPACE {

namespace {
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// a stored transposed (cols x rows row-major) is the same memory as rows x cols column-major
template <typename Out, typename Right>
void times_left(const Operand& a, const Right& right, Out& out, bool accumulate) {
  auto product = [&](const auto& left) {
    if (accumulate) out.noalias() += left * right;
    else out.noalias() = left * right;
  };
  if (a.transposed) product(Eigen::Map<const ColMajor>(a.data, a.rows, a.cols));
  else product(Eigen::Map<const RowMajor>(a.data, a.rows, a.cols));
}
}  // namespace

void gemm(const Operand& a, const Operand& b, float* c, bool accumulate) {
  Eigen::Map<RowMajor> out(c, a.rows, b.cols);
  if (b.transposed) times_left(a, Eigen::Map<const ColMajor>(b.data, b.rows, b.cols), out, accumulate);
  else times_left(a, Eigen::Map<const RowMajor>(b.data, b.rows, b.cols), out, accumulate);
}

}  // namespace edgefl::EDGEFL_GEMM_NAMESPACE
