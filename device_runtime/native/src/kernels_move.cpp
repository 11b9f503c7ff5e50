// Copies on runs of contiguous memory (fast_kernels.cpp says why): permute_copy, slice_copy, slice_scatter, cat,
// expand_copy.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels_internal.h"

namespace edgefl::kernels {

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

namespace {

// out (sizes `size`) = in broadcast: in's dimension d has out's size or 1 (stride 0); the innermost dimension is a
// copied row or a filled one
void expand(const float* in, float* out, const Dims& size, const Dims& in_stride, size_t d) {
  const int64_t n = size[d];
  if (d + 1 == size.size()) {
    if (in_stride[d] == 0) std::fill(out, out + n, in[0]);
    else std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  int64_t block = 1;
  for (size_t i = d + 1; i < size.size(); i++) block *= size[i];
  for (int64_t i = 0; i < n; i++) {
    if (i > 0 && in_stride[d] == 0) {     // the same source again: copy the block just written
      std::memcpy(out + i * block, out, static_cast<size_t>(block) * sizeof(float));
      continue;
    }
    expand(in + i * in_stride[d], out + i * block, size, in_stride, d + 1);
  }
}

}  // namespace

// expand_copy.out(self, size, implicit, *, out): self broadcast to out's shape (a mean's or a sum's backward, a
// batch norm's statistics over a batch); the shipped kernel repeats element by element (repeat_tensor: 9% of a
// ResNet-20 step under perf)
void expand_copy_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[3]->toTensor();
  if (!plain_float(in) || !plain_float(out) || in.dim() > out.dim() || out.dim() == 0)
    return fallbacks().expand(context, stack);
  const int64_t lead = out.dim() - in.dim();
  Dims size(out.sizes().begin(), out.sizes().end()), in_stride(size.size(), 0);
  int64_t stride = 1;
  for (int64_t d = in.dim() - 1; d >= 0; d--) {
    const int64_t s = in.size(d);
    if (s != 1 && s != size[lead + d]) return fallbacks().expand(context, stack);
    in_stride[lead + d] = s == 1 ? 0 : stride;
    stride *= s;
  }
  expand(in.const_data_ptr<float>(), out.mutable_data_ptr<float>(), size, in_stride, 0);
  calls[kExpand]++;
}

}  // namespace edgefl::kernels
