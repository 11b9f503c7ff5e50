// 2-D convolution and its backward (fast_kernels.cpp registers them), one sample at a time. At stride 1 the
// convolution, its input's gradient (itself a convolution of the output's gradient) and its weight's gradient are
// products over the zero-padded sample's shifted rows (gemm.h: gemm_rows, gemm_rows_left), no patch matrix;
// otherwise im2col into a per-thread scratch matrix and Eigen's GEMM straight into the NCHW output, col2im back.
// The shipped kernels for these two operators are direct loops (seconds per ResNet step), which is why the
// exporter used to write convolutions as slices, concatenations and batched products (export/et_rewrites.py):
// a patch matrix k*k times the input in the program's memory plan, and a backward of k*k slice scatters and
// additions of input-sized tensors. Here a patch matrix is one sample's, outside the plan (at stride 1 a padded
// sample and an output-sized buffer instead): the largest convolution's, per thread, kept for the next step
// (edgefl.cost: the executorch family terms hold it).
//
// Served: float32 NCHW, groups 1, not transposed, any stride, padding and dilation; anything else goes to the
// shipped kernel. With --threads above 1 samples are split across the thread pool; the weight and bias
// gradients are then summed per thread's run of samples, then across runs in order (rounding differs from
// --threads 1 in the last bits, and is the same for a given thread count).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm.h"
#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

struct Geometry {
  int64_t n, c, h, w, o, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw;
  int64_t patch_rows() const { return c * kh * kw; }
  int64_t positions() const { return ho * wo; }
  // a 1x1 kernel over every position: the input sample is its own patch matrix
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// the convolution's shape from its input and weight and the stack's stride, padding, dilation, transposed,
// output padding and groups (at `at`); false where this file does not serve it
bool geometry(const Tensor& in, const Tensor& weight, Span<EValue*> stack, size_t at, Geometry& g) {
  if (!plain_float(in) || !plain_float(weight) || in.dim() != 4 || weight.dim() != 4 || weight.size(1) != in.size(1))
    return false;
  if (!pair(stack[at], g.sh, g.sw) || !pair(stack[at + 1], g.ph, g.pw) || !pair(stack[at + 2], g.dh, g.dw) ||
      !stack[at + 3]->isBool() || stack[at + 3]->toBool() || !stack[at + 5]->isInt() || stack[at + 5]->toInt() != 1)
    return false;
  g.n = in.size(0), g.c = in.size(1), g.h = in.size(2), g.w = in.size(3);
  g.o = weight.size(0), g.kh = weight.size(2), g.kw = weight.size(3);
  if (g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.dh < 1 || g.dw < 1) return false;
  g.ho = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  return g.ho > 0 && g.wo > 0;
}

bool sized(const Tensor& t, std::initializer_list<int64_t> sizes) { return plain_float(t) && sizes_are(t, sizes); }

// the output columns [first, last) whose input column ow * sw - pw + j * dw falls inside the row (the rest
// read padding)
void inside(const Geometry& g, int64_t j, int64_t& first, int64_t& last) {
  const int64_t shift = j * g.dw - g.pw;                     // input column of output column 0
  first = shift >= 0 ? 0 : (-shift + g.sw - 1) / g.sw;
  last = g.w - shift <= 0 ? 0 : std::min(g.wo, (g.w - shift + g.sw - 1) / g.sw);
  first = std::min(first, last);
}

// cols (c*kh*kw, ho*wo) of one sample x (c, h, w)
void im2col(const Geometry& g, const float* x, float* cols) {
  // stride 1 with the output as wide as the input (a "same" convolution): a patch row's valid rows are one block
  // of the input at a constant offset, copied at once, and the values that wrap in from the next row land on
  // the padding, zeroed after; rows are 8-32 values, a copy call each cost more than the copying
  const bool block = g.sh == 1 && g.sw == 1 && g.w == g.wo;
  for (int64_t c = 0; c < g.c; c++)
    for (int64_t i = 0; i < g.kh; i++)
      for (int64_t j = 0; j < g.kw; j++) {
        float* row = cols + ((c * g.kh + i) * g.kw + j) * g.positions();
        int64_t first, last;
        inside(g, j, first, last);
        const int64_t shift = j * g.dw - g.pw;
        if (block) {
          const int64_t top = i * g.dh - g.ph;                 // ih = oh + top
          const int64_t oh0 = std::clamp<int64_t>(-top, 0, g.ho), oh1 = std::clamp<int64_t>(g.h - top, oh0, g.ho);
          std::fill(row, row + oh0 * g.wo, 0.0f);
          std::fill(row + oh1 * g.wo, row + g.positions(), 0.0f);
          float* dst = row + oh0 * g.wo;
          const float* src = x + (c * g.h + oh0 + top) * g.w + shift;
          int64_t count = (oh1 - oh0) * g.wo - (shift < 0 ? -shift : shift);
          if (shift < 0) dst -= shift, src -= shift;
          if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
          for (int64_t oh = oh0; oh < oh1; oh++) {
            float* out = row + oh * g.wo;
            for (int64_t ow = 0; ow < first; ow++) out[ow] = 0.0f;
            for (int64_t ow = last; ow < g.wo; ow++) out[ow] = 0.0f;
          }
          continue;
        }
        for (int64_t oh = 0; oh < g.ho; oh++) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          float* out = row + oh * g.wo;
          if (ih < 0 || ih >= g.h) {
            std::fill(out, out + g.wo, 0.0f);
            continue;
          }
          const float* in = x + (c * g.h + ih) * g.w + shift;
          std::fill(out, out + first, 0.0f);
          if (g.sw == 1) std::memcpy(out + first, in + first, static_cast<size_t>(last - first) * sizeof(float));
          else
            for (int64_t ow = first; ow < last; ow++) out[ow] = in[ow * g.sw];
          std::fill(out + last, out + g.wo, 0.0f);
        }
      }
}

// dx (c, h, w) = the sum of cols' entries over the positions each input element was copied to
void col2im(const Geometry& g, const float* cols, float* dx) {
  std::fill(dx, dx + g.c * g.h * g.w, 0.0f);
  for (int64_t c = 0; c < g.c; c++)
    for (int64_t i = 0; i < g.kh; i++)
      for (int64_t j = 0; j < g.kw; j++) {
        const float* row = cols + ((c * g.kh + i) * g.kw + j) * g.positions();
        int64_t first, last;
        inside(g, j, first, last);
        const int64_t shift = j * g.dw - g.pw;
        for (int64_t oh = 0; oh < g.ho; oh++) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          float* __restrict x = dx + (c * g.h + ih) * g.w + shift;
          const float* __restrict in = row + oh * g.wo;
          if (g.sw == 1)      // the common case, a loop the compiler vectorizes
            for (int64_t ow = first; ow < last; ow++) x[ow] += in[ow];
          else
            for (int64_t ow = first; ow < last; ow++) x[ow * g.sw] += in[ow];
        }
      }
}

// per-thread buffers kept for the next call: 0 a patch matrix or a padded sample, 1 a shifted convolution's
// output or its output's gradient by position, 2 a flipped weight, 3 a weight gradient transposed
float* scratch(int64_t floats, int which) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < floats) b.resize(static_cast<size_t>(floats));
  return b.data();
}

// stride 1 (any padding, dilation): y (o, ho, wo) = W (o, c*kh*kw) . the sample's zero-padded copy read at
// each (c, i, j)'s shift (gemm.h: gemm_rows), over the positions oh * wp + ow of the padded width wp, whose last
// wp - wo columns a row are dropped on the way out: no patch matrix (9x the input for a 3x3 kernel) is written.
bool shiftable(const Geometry& g) { return g.sh == 1 && g.sw == 1 && !g.pointwise(); }

// a stride-1 convolution's positions at the padded width wp: n of them, a whole number of gemm_rows' vectors
struct Shifts {
  int64_t wp, plane, n;
  explicit Shifts(const Geometry& g)
      : wp(g.w + 2 * g.pw), plane((g.h + 2 * g.ph) * wp),
        n((g.ho * wp + kRowsMultiple - 1) / kRowsMultiple * kRowsMultiple) {}
};

// the sample x zero-padded (scratch 0), with zeros past its end, where the last shift's last vector reads. Each
// value written once, rows by loops: a row is 7-32 values, where a memcpy call costs more than the copy.
const float* padded_sample(const Geometry& g, const Shifts& s, const float* x) {
  float* padded = scratch(g.c * s.plane + kRowsMultiple, 0);
  float* to = padded;
  const auto zeros = [&to](int64_t count) {
    for (int64_t i = 0; i < count; i++) *to++ = 0.0f;
  };
  for (int64_t c = 0; c < g.c; c++) {
    zeros(g.ph * s.wp);
    for (int64_t ih = 0; ih < g.h; ih++) {
      zeros(g.pw);
      const float* from = x + (c * g.h + ih) * g.w;
      for (int64_t iw = 0; iw < g.w; iw++) *to++ = from[iw];
      zeros(g.pw);
    }
    zeros(g.ph * s.wp);
  }
  zeros(kRowsMultiple);
  return padded;
}

// where the patch matrix's row (c, i, j) starts in the padded sample
const int64_t* shift_offsets(const Geometry& g, const Shifts& s) {
  thread_local std::vector<int64_t> offsets;
  offsets.resize(static_cast<size_t>(g.patch_rows()));
  for (int64_t c = 0; c < g.c; c++)
    for (int64_t i = 0; i < g.kh; i++)
      for (int64_t j = 0; j < g.kw; j++) offsets[(c * g.kh + i) * g.kw + j] = c * s.plane + i * g.dh * s.wp + j * g.dw;
  return offsets.data();
}

void conv_shifted(const Geometry& g, const float* w, const float* x, const float* bias, float* y) {
  const Shifts s(g);
  const float* padded = padded_sample(g, s, x);
  float* t = scratch(g.o * s.n, 1);
  gemm_rows(g.o, s.n, g.patch_rows(), w, padded, shift_offsets(g, s), t);
  for (int64_t o = 0; o < g.o; o++) {
    const float b = bias ? bias[o] : 0.0f;
    for (int64_t oh = 0; oh < g.ho; oh++) {
      const float* from = t + o * s.n + oh * s.wp;
      float* to = y + (o * g.ho + oh) * g.wo;
      for (int64_t ow = 0; ow < g.wo; ow++) to[ow] = from[ow] + b;
    }
  }
}

// dW^T (c*kh*kw, o) (+)= the shifted rows . dY_s laid out position by channel at the padded width (the pad
// columns' positions skipped: 7-22% of the sum on 28-7 wide maps): each sample adds into the run's dW^T, which the
// run transposes into its dW once
bool weight_shiftable(const Geometry& g) { return shiftable(g) && g.o % kRowsMultiple == 0; }

void weight_gradient_shifted(const Geometry& g, const float* dys, const float* x, float* dwt, bool accumulate) {
  const Shifts s(g);
  const float* padded = padded_sample(g, s, x);
  // at the padded width, as the shifted rows are; the pad columns' positions are never read (nor written here)
  float* by_position = scratch(s.n * g.o, 1);
  // written in order, read from o streams that each stay in cache across a row
  for (int64_t oh = 0; oh < g.ho; oh++)
    for (int64_t ow = 0; ow < g.wo; ow++)
      for (int64_t o = 0; o < g.o; o++) by_position[(oh * s.wp + ow) * g.o + o] = dys[(o * g.ho + oh) * g.wo + ow];
  gemm_rows_left(g.patch_rows(), g.o, Positions{g.ho, g.wo, s.wp}, padded, shift_offsets(g, s), by_position, dwt,
                 accumulate);
}

// stride 1: the input's gradient is itself a convolution, of the output's gradient with the weight's channels
// swapped and its window flipped, padded by dilation * (k - 1) - padding (at least 0) so that it comes out the
// input's size: a product of the forward's shape (K = o*kh*kw) straight into the input's gradient, where a GEMM
// of K = o into a patch matrix and col2im's scatter of it back took 20% of a ResNet-20 step (perf). With the
// shifted rows above, a ResNet-20 step went from 145 to 113 ms (bench/results/device_speed.json).
bool transposable(const Geometry& g) {
  return g.sh == 1 && g.sw == 1 && g.ph <= g.dh * (g.kh - 1) && g.pw <= g.dw * (g.kw - 1);
}

Geometry transposed(const Geometry& g) {
  Geometry t = g;
  t.c = g.o, t.h = g.ho, t.w = g.wo, t.o = g.c, t.ho = g.h, t.wo = g.w;
  t.ph = g.dh * (g.kh - 1) - g.ph, t.pw = g.dw * (g.kw - 1) - g.pw;
  return t;
}

// w' (c, o, kh, kw) of w (o, c, kh, kw): channels swapped, window flipped
void flip(const Geometry& g, const float* w, float* flipped) {
  for (int64_t o = 0; o < g.o; o++)
    for (int64_t c = 0; c < g.c; c++)
      for (int64_t i = 0; i < g.kh; i++)
        for (int64_t j = 0; j < g.kw; j++)
          flipped[((c * g.o + o) * g.kh + (g.kh - 1 - i)) * g.kw + (g.kw - 1 - j)] =
              w[((o * g.c + c) * g.kh + i) * g.kw + j];
}

// how many runs of samples over_samples makes: one per thread, at most one per sample
int64_t sample_runs(int64_t n) {
  return std::min<int64_t>(n, std::max<int64_t>(1, executorch::extension::get_thread_count()));
}

// f(begin, end, run) over samples: one run of samples per thread (run 0 with one thread)
template <typename F>
void over_samples(int64_t n, F f) {
  const int64_t runs = sample_runs(n);
  if (runs == 1) return f(0, n, 0);
  executorch::extension::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) f(n * r / runs, n * (r + 1) / runs, r);
  });
}

}  // namespace

// convolution.out(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups, *, out)
void convolution_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  const Tensor& weight = stack[1]->toTensor();
  Tensor& out = stack[9]->toTensor();
  Geometry g;
  const bool biased = !stack[2]->isNone();
  if (!geometry(in, weight, stack, 3, g) || !sized(out, {g.n, g.o, g.ho, g.wo}) ||
      (biased && !sized(stack[2]->toTensor(), {g.o})))
    return fallbacks().convolution(context, stack);
  const float* x = in.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  const float* bias = biased ? stack[2]->toTensor().const_data_ptr<float>() : nullptr;
  float* y = out.mutable_data_ptr<float>();
  const int64_t rows = g.patch_rows(), positions = g.positions();
  over_samples(g.n, [&](int64_t begin, int64_t end, int64_t) {
    for (int64_t s = begin; s < end; s++) {
      const float* cols = x + s * g.c * g.h * g.w;
      float* ys = y + s * g.o * positions;
      if (shiftable(g)) {
        conv_shifted(g, w, cols, bias, ys);
        continue;
      }
      if (!g.pointwise()) {
        float* buffer = scratch(rows * positions, 0);
        im2col(g, cols, buffer);
        cols = buffer;
      }
      gemm(Operand{w, g.o, rows}, Operand{cols, rows, positions}, ys);
      if (bias)
        for (int64_t o = 0; o < g.o; o++)
          for (int64_t p = 0; p < positions; p++) ys[o * positions + p] += bias[o];
    }
  });
  calls[kConv]++;
}

// convolution_backward.out(grad_output, input, weight, bias_sizes?, stride, padding, dilation, transposed,
// output_padding, groups, output_mask, *, out0 (input's gradient), out1 (weight's), out2 (bias'))
void convolution_backward_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& grad = stack[0]->toTensor();
  const Tensor& in = stack[1]->toTensor();
  const Tensor& weight = stack[2]->toTensor();
  Geometry g;
  if (!geometry(in, weight, stack, 4, g) || !sized(grad, {g.n, g.o, g.ho, g.wo}) || !stack[10]->isBoolList() ||
      stack[10]->toBoolList().size() != 3)
    return fallbacks().convolution_backward(context, stack);
  const auto mask = stack[10]->toBoolList();
  Tensor& dx_t = stack[11]->toTensor();
  Tensor& dw_t = stack[12]->toTensor();
  Tensor& db_t = stack[13]->toTensor();
  if ((mask[0] && !sized(dx_t, {g.n, g.c, g.h, g.w})) || (mask[1] && !sized(dw_t, {g.o, g.c, g.kh, g.kw})) ||
      (mask[2] && !sized(db_t, {g.o})))
    return fallbacks().convolution_backward(context, stack);
  const float* dy = grad.const_data_ptr<float>();
  const float* x = in.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  const int64_t rows = g.patch_rows(), positions = g.positions(), per_sample = g.c * g.h * g.w;
  const int64_t runs = sample_runs(g.n);
  const bool by_convolution = mask[0] && !g.pointwise() && transposable(g);
  const Geometry back = transposed(g);
  float* flipped = by_convolution ? scratch(g.o * rows, 2) : nullptr;
  if (flipped) flip(g, w, flipped);
  // the weight and bias gradients of each run of samples; run 0's straight into the outputs
  std::vector<float> partial_w(mask[1] ? (runs - 1) * g.o * rows : 0), partial_b(mask[2] ? (runs - 1) * g.o : 0);
  float* dw = mask[1] ? dw_t.mutable_data_ptr<float>() : nullptr;
  float* db = mask[2] ? db_t.mutable_data_ptr<float>() : nullptr;
  over_samples(g.n, [&](int64_t begin, int64_t end, int64_t run) {
    float* run_dw = run == 0 ? dw : partial_w.data() + (run - 1) * g.o * rows;
    float* run_db = run == 0 ? db : partial_b.data() + (run - 1) * g.o;
    if (run_db) std::fill(run_db, run_db + g.o, 0.0f);
    for (int64_t s = begin; s < end; s++) {
      const float* dys = dy + s * g.o * positions;
      if (mask[1] && weight_shiftable(g)) {
        weight_gradient_shifted(g, dys, x + s * per_sample, scratch(rows * g.o, 3), s > begin);
      } else if (mask[1]) {
        const float* cols = x + s * per_sample;
        if (!g.pointwise()) {
          float* buffer = scratch(rows * positions, 0);
          im2col(g, cols, buffer);
          cols = buffer;
        }
        // dW (o, rows) += dY_s (o, positions) . cols^T (positions, rows)
        gemm(Operand{dys, g.o, positions}, Operand{cols, positions, rows, true}, run_dw, s > begin);
      }
      if (mask[0]) {
        // dcols (rows, positions) = W^T (rows, o) . dY_s (o, positions), then back onto the input's positions
        float* dxs = dx_t.mutable_data_ptr<float>() + s * per_sample;
        if (g.pointwise()) {
          gemm(Operand{w, rows, g.o, true}, Operand{dys, g.o, positions}, dxs);
        } else if (by_convolution) {
          conv_shifted(back, flipped, dys, nullptr, dxs);      // dX_s = W' convolved with dY_s
        } else {
          float* dcols = scratch(rows * positions, 1);
          gemm(Operand{w, rows, g.o, true}, Operand{dys, g.o, positions}, dcols);
          col2im(g, dcols, dxs);
        }
      }
      if (run_db)
        for (int64_t o = 0; o < g.o; o++) {
          float sum = 0.0f;
          for (int64_t p = 0; p < positions; p++) sum += dys[o * positions + p];
          run_db[o] += sum;
        }
    }
    if (mask[1] && weight_shiftable(g) && end > begin) {
      const float* dwt = scratch(rows * g.o, 3);
      for (int64_t o = 0; o < g.o; o++)
        for (int64_t r = 0; r < rows; r++) run_dw[o * rows + r] = dwt[r * g.o + o];
    }
  });
  for (int64_t r = 1; r < runs; r++) {
    if (dw)
      for (int64_t i = 0; i < g.o * rows; i++) dw[i] += partial_w[(r - 1) * g.o * rows + i];
    if (db)
      for (int64_t o = 0; o < g.o; o++) db[o] += partial_b[(r - 1) * g.o + o];
  }
  calls[kConvBackward]++;
}

}  // namespace edgefl::kernels
