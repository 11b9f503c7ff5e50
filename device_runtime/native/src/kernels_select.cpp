// Elementwise selection (fast_kernels.cpp registers them): where.self_out and le.Scalar_out on dense tensors, the
// two operators of relu's backward (where(x <= 0, 0, grad)), which runs once per trained activation. The shipped
// kernels walk broadcast indices per element (BroadcastIndexesIterator: 7% of a CNN step under perf) and convert
// through per-element function pointers; these are plain loops, exact as the shipped ones (selection and
// comparison round nothing).
#include <cstdint>

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
  const bool* c = condition.const_data_ptr<bool>();
  const float* x = a.const_data_ptr<float>();
  const float* y = b.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  const int64_t n = out.numel();
  // one loop per operand shape, each a select the compiler vectorizes (relu's backward: a value and a tensor)
  if (a.numel() == 1 && b.numel() == 1)
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[0] : y[0];
  else if (a.numel() == 1)
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[0] : y[i];
  else if (b.numel() == 1)
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[0];
  else
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];
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
