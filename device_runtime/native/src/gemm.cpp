#include "gemm.h"

#include <Eigen/Core>

namespace edgefl {

void gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMajor> left(a, m, k), right(b, k, n);
  Eigen::Map<RowMajor> out(c, m, n);
  out.noalias() = left * right;
}

const char* gemm_cpu_level() { return EDGEFL_CPU_LEVEL; }

}  // namespace edgefl
