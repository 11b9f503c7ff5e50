#include "gemm.h"

// Eigen packs each product's operands into blocks it allocates per call: on the stack up to this size, else on
// the heap, where a block above glibc's mmap threshold (128 KiB on a device: device_runtime/peaks.py) is a fresh
// mapping every call, its pages faulted in and zeroed by the kernel (4% of a CNN step under perf). Blocks are at
// most about the L2 cache's size: up to 1 MiB each stays on the stack, its pages touched once.
#define EIGEN_STACK_ALLOCATION_LIMIT (1 << 20)
#include <Eigen/Core>

namespace edgefl {

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

const char* gemm_cpu_level() { return EDGEFL_CPU_LEVEL; }

}  // namespace edgefl
