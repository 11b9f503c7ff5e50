// 2-D max pooling and its backward (fast_kernels.cpp registers them), so that a program keeps nn.MaxPool2d as
// aten.max_pool2d_with_indices. The exporter used to write a pool as a reshape, a permute and a max over the
// window axis, whose backward scatters into a zeroed window-sized tensor and permutes back: two input-sized
// copies each way and a max over a strided axis (a fifth of a CNN step). It had to: the shipped
// max_pool2d_with_indices_backward adds into a gradient buffer it never zeroes (pytorch/executorch#21686, fixed
// after the pinned release), so the convolution before a pool trained on stale arena bytes.
//
// The forward picks what torch's CPU kernel picks: the first maximum in scan order (rows, then columns), a NaN
// over any number (the last NaN of a window), padded positions never; indices are flat positions in the input
// plane, as torch's. The backward zeroes its output and adds each output gradient at its index; a case it does
// not serve (not float32 NCHW) is zeroed here and handed to the shipped kernel, which is then correct. It is
// registered even with --kernels shipped (fast_kernels.h: register_fixes).
//
// With --threads above 1 planes (sample, channel) are split across the thread pool: each output element is
// written by one thread, so results do not depend on the count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

// kernel size, stride (empty: the kernel size), padding and dilation from the stack at `at`
bool window(Span<EValue*> stack, size_t at, Window& g) {
  if (!pair(stack[at], g.kh, g.kw) || !pair(stack[at + 2], g.ph, g.pw) || !pair(stack[at + 3], g.dh, g.dw))
    return false;
  if (stack[at + 1]->isIntList() && stack[at + 1]->toIntList().size() == 0) g.sh = g.kh, g.sw = g.kw;
  else if (!pair(stack[at + 1], g.sh, g.sw)) return false;
  return g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0 && g.ph >= 0 && g.pw >= 0 && g.dh > 0 && g.dw > 0;
}

bool planes_match(const Tensor& a, const Tensor& b) { return a.size(0) == b.size(0) && a.size(1) == b.size(1); }

// runs f(first, last) over planes [0, planes), split across the thread pool when it has more than one thread
template <typename F>
void over_planes(int64_t planes, const F& f) {
  if (executorch::extension::get_thread_count() <= 1 || planes < 2) return f(0, planes);
  executorch::extension::parallel_for(0, planes, 1, [&](int64_t p0, int64_t p1) { f(p0, p1); });
}

// Takes v at index i over the window's maximum so far as torch's kernel does: larger, or NaN. Without branches:
// which element of a window is larger is a coin toss on real data, a branch mispredicted half the time.
inline void consider(float v, int64_t i, float& value, int64_t& best) {
  const bool take = v > value || std::isnan(v);
  value = take ? v : value;
  best = take ? i : best;
}

// any window: the scan order of torch's CPU kernel (rows, then columns), padding skipped
void pool_any(const float* plane, int64_t h, int64_t w, int64_t ho, int64_t wo, const Window& g, float* values,
              int64_t* best) {
  for (int64_t oh = 0; oh < ho; oh++) {
    int64_t h0 = oh * g.sh - g.ph;
    const int64_t h1 = std::min(h0 + (g.kh - 1) * g.dh + 1, h);
    while (h0 < 0) h0 += g.dh;
    for (int64_t ow = 0; ow < wo; ow++) {
      int64_t w0 = ow * g.sw - g.pw;
      const int64_t w1 = std::min(w0 + (g.kw - 1) * g.dw + 1, w);
      while (w0 < 0) w0 += g.dw;
      int64_t index = h0 * w + w0;
      float value = -std::numeric_limits<float>::infinity();
      for (int64_t ih = h0; ih < h1; ih += g.dh)
        for (int64_t iw = w0; iw < w1; iw += g.dw) consider(plane[ih * w + iw], ih * w + iw, value, index);
      values[oh * wo + ow] = value;
      best[oh * wo + ow] = index;
    }
  }
}

// the usual pool, 2x2 windows that tile the plane: the same scan, unrolled
void pool_2x2(const float* plane, int64_t w, int64_t ho, int64_t wo, float* values, int64_t* best) {
  for (int64_t oh = 0; oh < ho; oh++) {
    const int64_t top = 2 * oh * w, bottom = top + w;
    for (int64_t ow = 0; ow < wo; ow++) {
      const int64_t i = top + 2 * ow, j = bottom + 2 * ow;
      float value = -std::numeric_limits<float>::infinity();
      int64_t index = i;
      consider(plane[i], i, value, index);
      consider(plane[i + 1], i + 1, value, index);
      consider(plane[j], j, value, index);
      consider(plane[j + 1], j + 1, value, index);
      values[oh * wo + ow] = value;
      best[oh * wo + ow] = index;
    }
  }
}

}  // namespace

// max_pool2d_with_indices.out(self, kernel_size, stride, padding, dilation, ceil_mode, *, out, indices); the
// output's sizes (ceil mode included) are the out tensor's
void max_pool2d_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  Tensor& out = stack[6]->toTensor();
  Tensor& indices = stack[7]->toTensor();
  Window g;
  if (!plain_float(in) || !plain_float(out) || !dense(indices, ScalarType::Long) || in.dim() != 4 ||
      out.dim() != 4 || !same_sizes(out, indices) || !planes_match(in, out) || !window(stack, 1, g))
    return fallbacks().max_pool(context, stack);
  const int64_t h = in.size(2), w = in.size(3), ho = out.size(2), wo = out.size(3);
  const float* x = in.const_data_ptr<float>();
  float* y = out.mutable_data_ptr<float>();
  int64_t* at = indices.mutable_data_ptr<int64_t>();
  const bool tiles = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 && g.dh == 1 &&
                     g.dw == 1 && 2 * ho <= h && 2 * wo <= w;
  over_planes(in.size(0) * in.size(1), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
      const float* plane = x + p * h * w;
      float* values = y + p * ho * wo;
      int64_t* best = at + p * ho * wo;
      if (tiles) pool_2x2(plane, w, ho, wo, values, best);
      else pool_any(plane, h, w, ho, wo, g, values, best);
    }
  });
  calls[kMaxPool]++;
}

// max_pool2d_with_indices_backward.grad_input(grad_output, self, kernel_size, stride, padding, dilation,
// ceil_mode, indices, *, grad_input)
void max_pool2d_backward_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& grad_out = stack[0]->toTensor();
  const Tensor& in = stack[1]->toTensor();
  const Tensor& indices = stack[7]->toTensor();
  Tensor& grad_in = stack[8]->toTensor();
  if (!plain_float(grad_out) || !plain_float(grad_in) || !dense(indices, ScalarType::Long) || grad_in.dim() != 4 ||
      !same_sizes(grad_in, in) || !same_sizes(grad_out, indices) || grad_out.dim() != 4 ||
      !planes_match(grad_in, grad_out)) {
    if (grad_in.scalar_type() == ScalarType::Float && grad_in.numel() > 0)
      std::memset(grad_in.mutable_data_ptr<float>(), 0, grad_in.nbytes());
    return fallbacks().max_pool_backward(context, stack);
  }
  const int64_t plane_in = grad_in.size(2) * grad_in.size(3), plane_out = grad_out.size(2) * grad_out.size(3);
  const float* g = grad_out.const_data_ptr<float>();
  const int64_t* at = indices.const_data_ptr<int64_t>();
  float* gi = grad_in.mutable_data_ptr<float>();
  over_planes(grad_in.size(0) * grad_in.size(1), [&](int64_t p0, int64_t p1) {
    std::memset(gi + p0 * plane_in, 0, (p1 - p0) * plane_in * sizeof(float));
    for (int64_t p = p0; p < p1; p++) {
      float* dst = gi + p * plane_in;
      for (int64_t o = p * plane_out; o < (p + 1) * plane_out; o++) {
        const int64_t i = at[o];
        if (i >= 0 && i < plane_in) dst[i] += g[o];
      }
    }
  });
  calls[kMaxPoolBackward]++;
}

}  // namespace edgefl::kernels
