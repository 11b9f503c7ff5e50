#include "fast_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>

// Float32 kernels for the data-moving and reducing operators of edgefl's training programs, where the shipped
// kernels spend most of a step outside arithmetic: their permute_copy computes a multi-dimensional index per
// element (16% of a CNN step under perf, before any product), their sum/mean walk reduced dimensions through
// per-element index arithmetic (get_init_index, 8%). These work on runs of contiguous memory instead.
//
// They take over through ExecuTorch's kernel keys: a kernel registered for a dtype and dim order wins over the
// fallback kernel the shipped library registers for the same operator, whatever the registration order. Each
// is registered for contiguous float32 tensors of rank 1 to kMaxRank; any other case (a dtype argument, an
// empty tensor) goes to the shipped kernel, looked up as the registry's fallback. Copies are copies (bit-equal);
// each output of a reduction adds its inputs in ascending index with one float accumulator, which equals the
// shipped kernels bit for bit on the convolutional sets but not everywhere: on the transformer a loss differed
// by 2e-7 at step 2 (within the parity tolerance, tests/export/test_native_kernels.py).
namespace edgefl {
namespace {

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
             max = nullptr;
};
Fallbacks& fallbacks() {
  static Fallbacks f;
  return f;
}

// calls each kernel served itself (not handed to the shipped kernel), for the report: a program whose
// tensors never match the keys runs on the shipped kernels alone, and shows it
enum Op { kPermute, kSlice, kScatter, kCat, kMax, kSum, kMean, kOps };
const char* const kOpNames[kOps] = {"permute_copy", "slice_copy", "slice_scatter", "cat", "max.dim", "sum", "mean"};
uint64_t calls[kOps] = {};

bool plain_float(const Tensor& t) {
  return t.scalar_type() == ScalarType::Float && executorch::runtime::tensor_is_contiguous(t) && t.numel() > 0;
}

// out[o] = in[sum_i index_i * in_stride_i], out in order: merged dimensions, then a copy of runs where the
// last dimension is contiguous in the input, else a tiled 2-D transpose between the last output dimension
// and the one the input has contiguous.
void permute(const float* in, float* out, Dims size, Dims stride) {
  Dims s, st;                          // drop size-1 dimensions, merge neighbours contiguous in the input
  for (size_t i = 0; i < size.size(); i++) {
    if (size[i] == 1) continue;
    if (!s.empty() && st.back() == stride[i] * size[i]) {
      s.back() *= size[i];
      st.back() = stride[i];
    } else {
      s.push_back(size[i]);
      st.push_back(stride[i]);
    }
  }
  if (s.empty() || (s.size() == 1 && st[0] == 1)) {
    int64_t n = 1;
    for (int64_t v : size) n *= v;
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const size_t k = s.size();
  Dims ostride(k, 1);
  for (size_t i = k - 1; i > 0; i--) ostride[i - 1] = ostride[i] * s[i];
  size_t d = k;                        // the output dimension the input has contiguous
  for (size_t i = 0; i < k; i++)
    if (st[i] == 1) d = i;
  const int64_t last = s[k - 1], last_stride = st[k - 1];
  // the dimensions walked one index at a time: all but the last, and but d when tiling
  Dims outer_dims;
  for (size_t i = 0; i + 1 < k; i++)
    if (!(d < k - 1 && i == d)) outer_dims.push_back(static_cast<int64_t>(i));
  Dims index(outer_dims.size(), 0);
  constexpr int64_t kTile = 16;
  while (true) {
    int64_t ib = 0, ob = 0;
    for (size_t j = 0; j < outer_dims.size(); j++) {
      ib += index[j] * st[outer_dims[j]];
      ob += index[j] * ostride[outer_dims[j]];
    }
    if (last_stride == 1) {
      std::memcpy(out + ob, in + ib, static_cast<size_t>(last) * sizeof(float));
    } else if (d == k) {               // no contiguous input dimension among the merged ones (not reached)
      for (int64_t b = 0; b < last; b++) out[ob + b] = in[ib + b * last_stride];
    } else {
      const int64_t rows = s[d], row_out = ostride[d];
      for (int64_t a0 = 0; a0 < rows; a0 += kTile) {
        const int64_t a1 = std::min(rows, a0 + kTile);
        for (int64_t b0 = 0; b0 < last; b0 += kTile) {
          const int64_t b1 = std::min(last, b0 + kTile);
          for (int64_t a = a0; a < a1; a++) {
            float* o = out + ob + a * row_out;
            const float* i = in + ib + a;
            for (int64_t b = b0; b < b1; b++) o[b] = i[b * last_stride];
          }
        }
      }
    }
    size_t j = outer_dims.size();
    while (j > 0 && ++index[j - 1] == s[outer_dims[j - 1]]) index[--j] = 0;
    if (j == 0) return;
  }
}

void permute_copy_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[2]->toTensor();
  auto order = stack[1]->toIntList();
  const int64_t rank = in.dim();
  if (!plain_float(in) || !plain_float(out) || static_cast<int64_t>(order.size()) != rank || out.dim() != rank)
    return fallbacks().permute(context, stack);
  Dims size(rank), stride(rank), in_stride(rank, 1);
  for (int64_t i = rank - 1; i > 0; i--) in_stride[i - 1] = in_stride[i] * in.size(i);
  for (int64_t i = 0; i < rank; i++) {
    const int64_t axis = order[i] < 0 ? order[i] + rank : order[i];
    size[i] = in.size(axis);
    stride[i] = in_stride[axis];
    if (out.size(i) != size[i]) return fallbacks().permute(context, stack);
  }
  permute(in.const_data_ptr<float>(), out.mutable_data_ptr<float>(), size, stride);
  calls[kPermute]++;
}

// A tensor as (outer, size along dim, inner): what slicing and concatenating along `dim` move in blocks.
struct Around {
  int64_t outer = 1, along = 1, inner = 1;
};
Around around(const Tensor& t, int64_t dim) {
  Around a;
  for (int64_t i = 0; i < t.dim(); i++) (i < dim ? a.outer : i == dim ? a.along : a.inner) *= t.size(i);
  return a;
}

int64_t start_of(const EValue& start, int64_t size) {
  if (start.isNone()) return 0;
  int64_t s = start.toInt();
  if (s < 0) s += size;
  return std::min(std::max<int64_t>(s, 0), size);
}

// Rows `count` of `inner` floats, `step` rows apart in `strided` and adjacent in `packed`, for each outer
// index; gather when to_packed, else scatter.
void move_rows(float* packed, float* strided, const Around& p, const Around& s, int64_t start, int64_t step,
               bool to_packed) {
  const int64_t count = p.along, inner = p.inner;
  for (int64_t o = 0; o < p.outer; o++) {
    float* pk = packed + o * count * inner;
    float* st = strided + (o * s.along + start) * inner;
    if (step == 1) {
      to_packed ? std::memcpy(pk, st, count * inner * sizeof(float)) : std::memcpy(st, pk, count * inner * sizeof(float));
    } else if (inner == 1) {
      if (to_packed) for (int64_t j = 0; j < count; j++) pk[j] = st[j * step];
      else for (int64_t j = 0; j < count; j++) st[j * step] = pk[j];
    } else {
      for (int64_t j = 0; j < count; j++) {
        float* a = pk + j * inner;
        float* b = st + j * step * inner;
        to_packed ? std::memcpy(a, b, inner * sizeof(float)) : std::memcpy(b, a, inner * sizeof(float));
      }
    }
  }
}

int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

// slice_copy.Tensor_out(self, dim, start, end, step, out)
void slice_copy_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[5]->toTensor();
  const int64_t dim = wrap(stack[1]->toInt(), in.dim()), step = stack[4]->toInt();
  if (!plain_float(in) || !plain_float(out) || out.dim() != in.dim() || step < 1) return fallbacks().slice(context, stack);
  const Around a = around(in, dim), o = around(out, dim);
  const int64_t start = start_of(*stack[2], a.along);
  if (o.outer != a.outer || o.inner != a.inner || (o.along && start + (o.along - 1) * step >= a.along))
    return fallbacks().slice(context, stack);
  move_rows(out.mutable_data_ptr<float>(), const_cast<float*>(in.const_data_ptr<float>()), o, a, start, step, true);
  calls[kSlice]++;
}

// slice_scatter.out(self, src, dim, start, end, step, out)
void slice_scatter_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  const Tensor& src = stack[1]->toTensor();
  Tensor& out = stack[6]->toTensor();
  const int64_t dim = wrap(stack[2]->toInt(), in.dim()), step = stack[5]->toInt();
  if (!plain_float(in) || !plain_float(src) || !plain_float(out) || out.numel() != in.numel() ||
      src.dim() != in.dim() || step < 1)
    return fallbacks().scatter(context, stack);
  const Around a = around(in, dim), s = around(src, dim);
  const int64_t start = start_of(*stack[3], a.along);
  if (s.outer != a.outer || s.inner != a.inner || (s.along && start + (s.along - 1) * step >= a.along))
    return fallbacks().scatter(context, stack);
  float* o = out.mutable_data_ptr<float>();
  if (o != in.const_data_ptr<float>()) std::memcpy(o, in.const_data_ptr<float>(), in.numel() * sizeof(float));
  move_rows(const_cast<float*>(src.const_data_ptr<float>()), o, s, a, start, step, false);
  calls[kScatter]++;
}

// cat.out(tensors, dim, out)
void cat_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  auto tensors = stack[0]->toTensorList();
  Tensor& out = stack[2]->toTensor();
  if (!plain_float(out)) return fallbacks().cat(context, stack);
  const int64_t dim = wrap(stack[1]->toInt(), out.dim());
  const Around o = around(out, dim);
  int64_t along = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;   // torch's legacy empty (0,) inputs take no part
    if (!plain_float(t) || t.dim() != out.dim()) return fallbacks().cat(context, stack);
    const Around a = around(t, dim);
    if (a.outer != o.outer || a.inner != o.inner) return fallbacks().cat(context, stack);
    along += a.along;
  }
  if (along != o.along) return fallbacks().cat(context, stack);
  float* dst = out.mutable_data_ptr<float>();
  const int64_t row = o.along * o.inner;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const int64_t block = t.size(dim) * o.inner;
    const float* src = t.const_data_ptr<float>();
    for (int64_t i = 0; i < o.outer; i++) std::memcpy(dst + i * row + offset, src + i * block, block * sizeof(float));
    offset += block;
  }
  calls[kCat]++;
}

// max.dim_max(self, dim, keepdim, *, max, max_values): the largest value along dim and the index of its
// first occurrence; a NaN wins (its first occurrence), as in torch.
void max_dim_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& values = stack[3]->toTensor();
  Tensor& indices = stack[4]->toTensor();
  if (!plain_float(in) || !plain_float(values) || indices.scalar_type() != ScalarType::Long ||
      !executorch::runtime::tensor_is_contiguous(indices) || values.numel() != indices.numel())
    return fallbacks().max(context, stack);
  const int64_t dim = wrap(stack[1]->toInt(), in.dim());
  const Around a = around(in, dim);
  if (a.along == 0 || values.numel() != a.outer * a.inner) return fallbacks().max(context, stack);
  const float* x = in.const_data_ptr<float>();
  float* v = values.mutable_data_ptr<float>();
  int64_t* ix = indices.mutable_data_ptr<int64_t>();
  for (int64_t o = 0; o < a.outer; o++) {
    for (int64_t i = 0; i < a.inner; i++) {
      const float* p = x + o * a.along * a.inner + i;
      float best = p[0];
      int64_t at = 0;
      for (int64_t j = 1; j < a.along && !std::isnan(best); j++) {
        const float c = p[j * a.inner];
        if (c > best || std::isnan(c)) {
          best = c;
          at = j;
        }
      }
      v[o * a.inner + i] = best;
      ix[o * a.inner + i] = at;
    }
  }
  calls[kMax]++;
}

// Sums over the reduced dimensions in input order: merged into alternating kept/reduced groups, each output
// accumulates its inputs in ascending input index with one float, as the shipped reduction does.
void reduce_sum(const float* in, float* out, const Dims& size, const std::vector<bool>& reduced) {
  Dims s;
  std::vector<bool> r;
  for (size_t i = 0; i < size.size(); i++) {
    if (size[i] == 1) continue;
    if (!s.empty() && r.back() == reduced[i]) s.back() *= size[i];
    else {
      s.push_back(size[i]);
      r.push_back(reduced[i]);
    }
  }
  if (s.empty()) {
    out[0] = 0.0f + in[0];
    return;
  }
  const size_t k = s.size();
  int64_t out_numel = 1;
  Dims ostride(k, 0);
  for (size_t i = k; i-- > 0;)
    if (!r[i]) {
      ostride[i] = out_numel;
      out_numel *= s[i];
    }
  std::fill(out, out + out_numel, 0.0f);
  const int64_t last = s[k - 1];
  Dims index(k - 1, 0);
  int64_t in_offset = 0;
  while (true) {
    int64_t ob = 0;
    for (size_t j = 0; j + 1 < k; j++) ob += index[j] * ostride[j];
    const float* row = in + in_offset;
    if (r[k - 1]) {
      float acc = out[ob];
      for (int64_t b = 0; b < last; b++) acc += row[b];
      out[ob] = acc;
    } else {
      float* o = out + ob;
      for (int64_t b = 0; b < last; b++) o[b] += row[b];
    }
    in_offset += last;
    size_t j = k - 1;
    while (j > 0 && ++index[j - 1] == s[j - 1]) index[--j] = 0;
    if (j == 0) return;
  }
}

// sum.IntList_out / mean.out: (self, dim, keepdim, dtype, out)
bool reduce(Span<EValue*> stack, int64_t* count) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[4]->toTensor();
  if (!plain_float(in) || !plain_float(out) || !stack[3]->isNone()) return false;
  const int64_t rank = in.dim();
  std::vector<bool> reduced(rank, false);
  if (stack[1]->isNone() || stack[1]->toIntList().size() == 0) {
    std::fill(reduced.begin(), reduced.end(), true);
  } else {
    for (int64_t d : stack[1]->toIntList()) reduced[d < 0 ? d + rank : d] = true;
  }
  Dims size(rank);
  *count = 1;
  int64_t kept = 1;
  for (int64_t i = 0; i < rank; i++) {
    size[i] = in.size(i);
    (reduced[i] ? *count : kept) *= size[i];
  }
  if (kept != out.numel()) return false;
  reduce_sum(in.const_data_ptr<float>(), out.mutable_data_ptr<float>(), size, reduced);
  return true;
}

void sum_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  int64_t count = 0;
  if (!reduce(stack, &count)) return fallbacks().sum(context, stack);
  calls[kSum]++;
}

void mean_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  int64_t count = 0;
  if (!reduce(stack, &count)) return fallbacks().mean(context, stack);
  Tensor& out = stack[4]->toTensor();
  float* o = out.mutable_data_ptr<float>();
  const float n = static_cast<float>(count);
  for (int64_t i = 0; i < out.numel(); i++) o[i] = o[i] / n;
  calls[kMean]++;
}

// Kernel key strings live as long as the registry (the process): it keeps pointers to them.
std::deque<std::string>& keys() {
  static std::deque<std::string> k;
  return k;
}

// ranks of contiguous float32 tensors; a negative rank -r: an int64 tensor of rank r (indices)
const char* key(const std::vector<int>& ranks) {
  static executorch::aten::DimOrderType order[kMaxRank] = {0, 1, 2, 3, 4, 5};
  std::vector<TensorMeta> metas;
  for (int r : ranks)
    metas.emplace_back(r < 0 ? ScalarType::Long : ScalarType::Float,
                       Span<executorch::aten::DimOrderType>(order, r < 0 ? -r : r));
  char buf[executorch::runtime::internal::kKernelKeyBufSize];
  if (executorch::runtime::internal::make_kernel_key_string({metas.data(), metas.size()}, buf, sizeof buf) !=
      executorch::runtime::Error::Ok)
    return nullptr;
  keys().emplace_back(buf);
  return keys().back().c_str();
}

OpFunction shipped(const char* name) {
  auto f = executorch::runtime::get_op_function_from_registry(name, {});
  return f.ok() ? *f : nullptr;
}

}  // namespace

std::vector<std::pair<std::string, uint64_t>> fast_kernel_calls() {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (int i = 0; i < kOps; i++) out.emplace_back(kOpNames[i], calls[i]);
  return out;
}

bool register_fast_kernels() {
  static bool done = false;
  if (done) return true;
  Fallbacks& f = fallbacks();
  f.permute = shipped("aten::permute_copy.out");
  f.sum = shipped("aten::sum.IntList_out");
  f.mean = shipped("aten::mean.out");
  f.slice = shipped("aten::slice_copy.Tensor_out");
  f.scatter = shipped("aten::slice_scatter.out");
  f.cat = shipped("aten::cat.out");
  f.max = shipped("aten::max.dim_max");
  if (!f.max || !f.permute || !f.sum || !f.mean || !f.slice || !f.scatter || !f.cat) return false;
  std::vector<Kernel> kernels;
  // a program's instruction lists the out variant's return value (the out tensor again) after its arguments,
  // and the key is made of every tensor there: (self, out, out); the key without it serves a call by name
  for (int r = 1; r <= kMaxRank; r++) {
    for (bool ret : {false, true}) {
      const std::vector<int> same = ret ? std::vector<int>{r, r, r} : std::vector<int>{r, r};
      kernels.emplace_back("aten::permute_copy.out", key(same), permute_copy_out);
      kernels.emplace_back("aten::slice_copy.Tensor_out", key(same), slice_copy_out);
      kernels.emplace_back("aten::slice_scatter.out", key(ret ? std::vector<int>{r, r, r, r} : std::vector<int>{r, r, r}),
                           slice_scatter_out);
      // a tensor list is no part of a kernel key
      kernels.emplace_back("aten::cat.out", key(ret ? std::vector<int>{r, r} : std::vector<int>{r}), cat_out);
      for (int o = r - 1; o <= r; o++) {   // keepdim or not
        if (o < 1) continue;
        kernels.emplace_back("aten::max.dim_max",
                             key(ret ? std::vector<int>{r, o, -o, o, -o} : std::vector<int>{r, o, -o}), max_dim_out);
      }
      for (int o = 0; o <= r; o++) {
        const std::vector<int> ranks = ret ? std::vector<int>{r, o, o} : std::vector<int>{r, o};
        kernels.emplace_back("aten::sum.IntList_out", key(ranks), sum_out);
        kernels.emplace_back("aten::mean.out", key(ranks), mean_out);
      }
    }
  }
  for (const Kernel& k : kernels)
    if (k.kernel_key_.is_fallback()) return false;
  done = executorch::runtime::register_kernels({kernels.data(), kernels.size()}) == executorch::runtime::Error::Ok;
  return done;
}

}  // namespace edgefl
