#include "gemm.h"

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
