// Elementwise selection (fast_kernels.cpp registers them): where.self_out and le.Scalar_out on dense tensors, the
// two operators of relu's backward (where(x <= 0, 0, grad)), which runs once per trained activation. The shipped
// kernels walk broadcast indices per element (BroadcastIndexesIterator: 7% of a CNN step under perf) and convert
// through per-element function pointers; these are plain loops, exact as the shipped ones (selection and
// comparison round nothing).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

// an operand of `out`'s shape, or a single value broadcast over it
bool operand(const Tensor& t, const Tensor& out) {
  return dense(t, ScalarType::Float) && (t.numel() == 1 || same_sizes(t, out));
}

}  // namespace

// where.self_out(condition, self, other, *, out): out[i] = condition[i] ? self[i] : other[i]
void where_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& condition = stack[0]->toTensor();
  const Tensor& a = stack[1]->toTensor();
  const Tensor& b = stack[2]->toTensor();
  Tensor& out = stack[3]->toTensor();
  if (!dense(out, ScalarType::Float) || !dense(condition, ScalarType::Bool) || !same_sizes(condition, out) ||
      !operand(a, out) || !operand(b, out))
    return fallbacks().where(context, stack);
  const int64_t n = out.numel();
  // one loop per operand shape (relu's backward: a value and a tensor), each a select the compiler vectorizes:
  // on the bits, with a mask from the condition (GCC 12 vectorizes neither a float ?: on a bool nor a conditional
  // read; a branch per element is mispredicted half the time on a ReLU's mask)
  const uint8_t* __restrict mask = reinterpret_cast<const uint8_t*>(condition.const_data_ptr<bool>());
  const float* __restrict x = a.const_data_ptr<float>();
  const float* __restrict y = b.const_data_ptr<float>();
  float* __restrict result = out.mutable_data_ptr<float>();
  auto select = [&](auto x_step, auto y_step) {
    for (int64_t i = 0; i < n; i++) {
      const uint32_t m = 0u - static_cast<uint32_t>(mask[i] != 0);
      uint32_t xi, yi;
      std::memcpy(&xi, x + i * x_step, 4);
      std::memcpy(&yi, y + i * y_step, 4);
      const uint32_t r = (xi & m) | (yi & ~m);
      std::memcpy(result + i, &r, 4);
    }
  };
  using Each = std::integral_constant<int64_t, 1>;
  using One = std::integral_constant<int64_t, 0>;
  if (a.numel() == 1 && b.numel() == 1) select(One{}, One{});
  else if (a.numel() == 1) select(One{}, Each{});
  else if (b.numel() == 1) select(Each{}, One{});
  else select(Each{}, Each{});
  calls[kWhere]++;
}

// le.Scalar_out(self, other, *, out): out[i] = self[i] <= other (false for NaN, as in torch)
void le_scalar_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[2]->toTensor();
  const EValue& other = *stack[1];
  if (!dense(in, ScalarType::Float) || !dense(out, ScalarType::Bool) || !same_sizes(in, out) ||
      !(other.isDouble() || other.isInt()))
    return fallbacks().le(context, stack);
  // the shipped kernel compares in the input's dtype: the scalar cast to float first
  const float v = other.isDouble() ? static_cast<float>(other.toDouble()) : static_cast<float>(other.toInt());
  const float* x = in.const_data_ptr<float>();
  bool* o = out.mutable_data_ptr<bool>();
  const int64_t n = in.numel();
  for (int64_t i = 0; i < n; i++) o[i] = x[i] <= v;
  calls[kLe]++;
}

}  // namespace edgefl::kernels
