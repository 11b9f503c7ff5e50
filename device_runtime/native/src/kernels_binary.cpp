// Elementwise add, sub and mul of float32 tensors with broadcasting (fast_kernels.cpp registers them): residual
// additions, a loss's arithmetic, and a batch norm in evaluation mode, written out of products on activations
// times a per-channel (1, C, 1, 1) operand (in training, before edgefl::batch_norm, a dozen of them per layer
// and pass: the shipped kernels spent a third of a ResNet-20 step there). Here the operands' shapes are
// collapsed to runs that the innermost loop walks with a step of 1 (a tensor) or 0 (a broadcast value), a loop
// the compiler vectorizes.
//
// Exact as the shipped kernels: each output is one IEEE operation on its two inputs. Served: float32 inputs and
// output, dense, each input's sizes broadcastable to the output's (right-aligned, a size of 1 or the output's),
// alpha 1 (a scaled add is a fused multiply-add in torch's kernel, two roundings in a plain loop); the rest goes
// to the shipped kernel.
#include <cstdint>
#include <type_traits>

#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

enum class BinaryOp { kAdd, kSub, kMul };

// The output's shape as runs: sizes[i], and each input's step per run (0: broadcast), innermost last.
struct Runs {
  int64_t sizes[kMaxRank], a[kMaxRank], b[kMaxRank];
  int rank = 0;
};

// each input's contiguous strides, 0 on dimensions it broadcasts; false if it does not broadcast to `out`
bool strides(const Tensor& t, const Tensor& out, int64_t* s) {
  const int64_t rank = out.dim(), offset = rank - t.dim();
  if (offset < 0) return false;
  int64_t stride = 1;
  for (int64_t d = rank - 1; d >= 0; d--) {
    const int64_t size = d < offset ? 1 : t.size(d - offset);
    if (size != 1 && size != out.size(d)) return false;
    s[d] = size == 1 ? 0 : stride;
    stride *= size;
  }
  return true;
}

// dimensions merged where both inputs walk them as one (both contiguous across them, or both broadcast)
Runs collapse(const Tensor& out, const int64_t* sa, const int64_t* sb) {
  Runs r;
  for (int64_t d = 0; d < out.dim(); d++) {
    if (out.size(d) == 1) continue;
    if (r.rank > 0) {
      const int i = r.rank - 1;
      const bool a_joins = r.a[i] == sa[d] * out.size(d), b_joins = r.b[i] == sb[d] * out.size(d);
      if (a_joins && b_joins) {
        r.sizes[i] *= out.size(d);
        r.a[i] = sa[d], r.b[i] = sb[d];
        continue;
      }
    }
    r.sizes[r.rank] = out.size(d), r.a[r.rank] = sa[d], r.b[r.rank] = sb[d];
    r.rank++;
  }
  if (r.rank == 0) r.sizes[0] = 1, r.a[0] = r.b[0] = 0, r.rank = 1;
  return r;
}

template <BinaryOp op>
inline float apply(float x, float y) {
  if constexpr (op == BinaryOp::kAdd) return x + y;
  else if constexpr (op == BinaryOp::kSub) return x - y;
  else return x * y;
}

template <BinaryOp op, typename AStep, typename BStep>
void inner(const float* __restrict x, const float* __restrict y, float* __restrict o, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = apply<op>(x[i * AStep::value], y[i * BStep::value]);
}

template <BinaryOp op>
void run(const Runs& r, const float* x, const float* y, float* o) {
  using One = std::integral_constant<int64_t, 1>;
  using Zero = std::integral_constant<int64_t, 0>;
  const int last = r.rank - 1;
  const int64_t n = r.sizes[last];
  auto line = r.a[last] == 1 ? (r.b[last] == 1 ? inner<op, One, One> : inner<op, One, Zero>)
                             : (r.b[last] == 1 ? inner<op, Zero, One> : inner<op, Zero, Zero>);
  int64_t index[kMaxRank] = {};
  int64_t lines = 1;
  for (int d = 0; d < last; d++) lines *= r.sizes[d];
  int64_t ia = 0, ib = 0;
  for (int64_t l = 0; l < lines; l++, o += n) {
    line(x + ia, y + ib, o, n);
    for (int d = last - 1; d >= 0; d--) {      // the next line: an odometer over the outer runs
      ia += r.a[d], ib += r.b[d];
      if (++index[d] < r.sizes[d]) break;
      ia -= r.a[d] * r.sizes[d], ib -= r.b[d] * r.sizes[d];
      index[d] = 0;
    }
  }
}

bool alpha_is_one(const EValue& alpha) {
  return (alpha.isInt() && alpha.toInt() == 1) || (alpha.isDouble() && alpha.toDouble() == 1.0);
}

template <BinaryOp op>
void binary_out(KernelRuntimeContext& context, Span<EValue*> stack, OpFunction fallback, Op counter) {
  const Tensor& a = stack[0]->toTensor();
  const Tensor& b = stack[1]->toTensor();
  const bool scaled = op != BinaryOp::kMul;      // add.out / sub.out: (self, other, alpha, out)
  Tensor& out = stack[scaled ? 3 : 2]->toTensor();
  int64_t sa[kMaxRank], sb[kMaxRank];
  if (!plain_float(a) || !plain_float(b) || !plain_float(out) || out.dim() > kMaxRank ||
      (scaled && !alpha_is_one(*stack[2])) || !strides(a, out, sa) || !strides(b, out, sb))
    return fallback(context, stack);
  run<op>(collapse(out, sa, sb), a.const_data_ptr<float>(), b.const_data_ptr<float>(),
          out.mutable_data_ptr<float>());
  calls[counter]++;
}

}  // namespace

void add_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  binary_out<BinaryOp::kAdd>(context, stack, fallbacks().add, kAdd);
}
void sub_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  binary_out<BinaryOp::kSub>(context, stack, fallbacks().sub, kSub);
}
void mul_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  binary_out<BinaryOp::kMul>(context, stack, fallbacks().mul, kMul);
}

}  // namespace edgefl::kernels
