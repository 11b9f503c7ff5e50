// What edgefl's float32 kernels (fast_kernels.cpp) share: ExecuTorch's types, the shipped kernels they hand
// other cases to, the calls each served, and the shapes copies and reductions walk. Internal to the trainer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/function_ref.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>

namespace executorch::extension {
// libexecutorch_threadpool's; the wheel ships the symbols but not the header (extension/parallel)
bool parallel_for(int64_t begin, int64_t end, int64_t grain_size,
                  executorch::runtime::FunctionRef<void(int64_t, int64_t)> f);
int64_t get_thread_count();
}  // namespace executorch::extension

namespace edgefl::kernels {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::EValue;
using executorch::runtime::Kernel;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::OpFunction;
using executorch::runtime::Span;
using executorch::runtime::TensorMeta;

constexpr int kMaxRank = 6;
using Dims = std::vector<int64_t>;

struct Fallbacks {
  OpFunction permute = nullptr, sum = nullptr, mean = nullptr, slice = nullptr, scatter = nullptr, cat = nullptr,
             bmm = nullptr, mm = nullptr, convolution = nullptr, convolution_backward = nullptr, where = nullptr,
             le = nullptr, expand = nullptr, max_pool = nullptr, max_pool_backward = nullptr, add = nullptr,
             sub = nullptr, mul = nullptr;
};
Fallbacks& fallbacks();

// calls each kernel served itself (not handed to the shipped kernel), for the report: a program whose
// tensors never match the keys runs on the shipped kernels alone, and shows it
enum Op { kPermute, kSlice, kScatter, kCat, kSum, kMean, kBmm, kMm, kConv, kConvBackward, kWhere, kLe, kExpand,
          kMaxPool, kMaxPoolBackward, kAdd, kSub, kMul, kBatchNorm, kBatchNormBackward, kOps };
const char* const kOpNames[kOps] = {"permute_copy", "slice_copy", "slice_scatter", "cat", "sum", "mean", "bmm", "mm",
                                    "convolution", "convolution_backward", "where", "le", "expand_copy",
                                    "max_pool2d", "max_pool2d_backward", "add", "sub", "mul", "batch_norm",
                                    "batch_norm_backward"};
extern uint64_t calls[kOps];

inline bool dense(const Tensor& t, ScalarType type) {
  return t.scalar_type() == type && executorch::runtime::tensor_is_contiguous(t) && t.numel() > 0;
}
inline bool plain_float(const Tensor& t) { return dense(t, ScalarType::Float); }

inline bool sizes_are(const Tensor& t, std::initializer_list<int64_t> sizes) {
  if (t.dim() != static_cast<int64_t>(sizes.size())) return false;
  int64_t i = 0;
  for (int64_t s : sizes)
    if (t.size(i++) != s) return false;
  return true;
}
inline bool same_sizes(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); i++)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

// value(0) + ... + value(n - 1): lane l sums the values at l, l + 16, ...; the lanes are added pairwise, then
// the last n % 16 values in order. One accumulator in order waits a full addition per value (9% of a ResNet-20
// step) and is the less accurate; this order is fixed, so the same sum on every run and thread count.
template <typename Value>
inline float lane_sum(int64_t n, const Value& value) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t b = 0;
  for (; b + kLanes <= n; b += kLanes)
    for (int l = 0; l < kLanes; l++) lanes[l] += value(b + l);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
  float total = lanes[0];
  for (; b < n; b++) total += value(b);
  return total;
}

// A tensor as (outer, size along dim, inner): what slicing and concatenating along `dim` move in blocks.
struct Around {
  int64_t outer = 1, along = 1, inner = 1;
};
inline Around around(const Tensor& t, int64_t dim) {
  Around a;
  for (int64_t i = 0; i < t.dim(); i++) (i < dim ? a.outer : i == dim ? a.along : a.inner) *= t.size(i);
  return a;
}

// an int[2] argument (a kernel size, stride, padding, dilation): two values, or one for both
inline bool pair(const EValue* v, int64_t& first, int64_t& second) {
  if (!v->isIntList()) return false;
  auto list = v->toIntList();
  if (list.size() == 1) first = second = list[0];
  else if (list.size() == 2) first = list[0], second = list[1];
  else return false;
  return true;
}

inline int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

// The kernels (stack: the out variant's arguments as a program's instruction lists them).
void permute_copy_out(KernelRuntimeContext& context, Span<EValue*> stack);   // kernels_move.cpp
void slice_copy_out(KernelRuntimeContext& context, Span<EValue*> stack);
void slice_scatter_out(KernelRuntimeContext& context, Span<EValue*> stack);
void cat_out(KernelRuntimeContext& context, Span<EValue*> stack);
void expand_copy_out(KernelRuntimeContext& context, Span<EValue*> stack);
void sum_out(KernelRuntimeContext& context, Span<EValue*> stack);            // kernels_reduce.cpp
void mean_out(KernelRuntimeContext& context, Span<EValue*> stack);
void bmm_out(KernelRuntimeContext& context, Span<EValue*> stack);            // kernels_matmul.cpp
void mm_out(KernelRuntimeContext& context, Span<EValue*> stack);
void convolution_out(KernelRuntimeContext& context, Span<EValue*> stack);   // kernels_conv.cpp
void convolution_backward_out(KernelRuntimeContext& context, Span<EValue*> stack);
void max_pool2d_out(KernelRuntimeContext& context, Span<EValue*> stack);    // kernels_pool.cpp
void max_pool2d_backward_out(KernelRuntimeContext& context, Span<EValue*> stack);
void add_out(KernelRuntimeContext& context, Span<EValue*> stack);           // kernels_binary.cpp
void sub_out(KernelRuntimeContext& context, Span<EValue*> stack);
void mul_out(KernelRuntimeContext& context, Span<EValue*> stack);
void where_out(KernelRuntimeContext& context, Span<EValue*> stack);         // kernels_select.cpp
void batch_norm_out(KernelRuntimeContext& context, Span<EValue*> stack);    // kernels_norm.cpp
void batch_norm_backward_out(KernelRuntimeContext& context, Span<EValue*> stack);
void le_scalar_out(KernelRuntimeContext& context, Span<EValue*> stack);

}  // namespace edgefl::kernels
