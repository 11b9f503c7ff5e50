// Matrix products (fast_kernels.cpp registers them): bmm and mm on dense float32 tensors, through gemm.h. The
// training programs write every linear layer as these (export/et_rewrites.py), and autograd's products of a
// layer's backward. With --threads above 1 the products are split across the trainer's thread pool by batch
// entry and row block; each output element is computed by one thread, so the result does not depend on the count.
#include <algorithm>
#include <cstdint>

#include "gemm.h"
#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

constexpr int64_t kMinRowsPerTask = 16;   // a thinner slice costs more in packing the right operand than it saves

// out[b] = left[b] . right[b] for b < batch; each (m x k) . (k x n), dense
void products(int64_t batch, int64_t m, int64_t n, int64_t k, const float* left, const float* right, float* out) {
  const int64_t threads = std::max<int64_t>(1, executorch::extension::get_thread_count());
  int64_t blocks = 1;                      // row blocks per product: only when the batch cannot keep threads busy
  if (threads > batch) blocks = std::min((threads + batch - 1) / batch, std::max<int64_t>(1, m / kMinRowsPerTask));
  const int64_t rows = (m + blocks - 1) / blocks;
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; task++) {
      const int64_t b = task / blocks, r0 = (task % blocks) * rows, r1 = std::min(m, r0 + rows);
      if (r0 < r1) gemm(r1 - r0, n, k, left + (b * m + r0) * k, right + b * k * n, out + (b * m + r0) * n);
    }
  };
  if (threads == 1 || batch * blocks == 1) run(0, batch * blocks);
  else executorch::extension::parallel_for(0, batch * blocks, 1, run);
}

}  // namespace

// bmm.out(self, mat2, *, out): (B, M, K) . (B, K, N) -> (B, M, N)
void bmm_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& a = stack[0]->toTensor();
  const Tensor& b = stack[1]->toTensor();
  Tensor& out = stack[2]->toTensor();
  if (!plain_float(a) || !plain_float(b) || !plain_float(out) || a.dim() != 3 || b.dim() != 3 ||
      b.size(0) != a.size(0) || b.size(1) != a.size(2) || !sizes_are(out, {a.size(0), a.size(1), b.size(2)}))
    return fallbacks().bmm(context, stack);
  products(a.size(0), a.size(1), b.size(2), a.size(2), a.const_data_ptr<float>(), b.const_data_ptr<float>(),
           out.mutable_data_ptr<float>());
  calls[kBmm]++;
}

// mm.out(self, mat2, *, out): (M, K) . (K, N) -> (M, N)
void mm_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& a = stack[0]->toTensor();
  const Tensor& b = stack[1]->toTensor();
  Tensor& out = stack[2]->toTensor();
  if (!plain_float(a) || !plain_float(b) || !plain_float(out) || a.dim() != 2 || b.dim() != 2 ||
      b.size(0) != a.size(1) || !sizes_are(out, {a.size(0), b.size(1)}))
    return fallbacks().mm(context, stack);
  products(1, a.size(0), b.size(1), a.size(1), a.const_data_ptr<float>(), b.const_data_ptr<float>(),
           out.mutable_data_ptr<float>());
  calls[kMm]++;
}

}  // namespace edgefl::kernels
