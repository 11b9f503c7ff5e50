// Batch norm in training and its backward as two fused kernels: edgefl::batch_norm.out and
// edgefl::batch_norm_backward.out, the operators edgefl's exporter writes a BatchNorm2d as (edgefl.export.et_ops:
// their definition, arguments and a torch implementation of the same arithmetic). Written out of means,
// products and sums, a batch norm was about a dozen elementwise passes and half a dozen reductions over its
// input each step, each writing an input-sized tensor of the program's memory plan: a seventh of a ResNet-20
// step. Here the forward reads its input twice (mean, then variance) and writes its output once; the backward
// reads the gradient and the input once for its two sums and once more to write the input's gradient.
//
// `t` (a float scalar, 1 to train, 0 to evaluate through the training program) chooses batch or running
// statistics as the exporter's written-out form did: t * batch + (1 - t) * running, exact for 0 and 1.
// Channels are split across the thread pool; each channel's sums run in one thread, in 16 interleaved partial
// sums combined pairwise (kernels_internal.h: lane_sum), so results do not depend on the thread count. Only
// float32 NCHW is exported as these operators; anything else fails the method (there is no shipped kernel).
// Registered even with --kernels shipped (fast_kernels.h: register_fixes): no other kernel serves them.
#include <cmath>
#include <cstdint>

#include "kernels_internal.h"

namespace edgefl::kernels {

namespace {

// the sum of f(i) over a channel's planes: n planes of hw values, plane p at p * stride, each a lane_sum
template <typename F>
float channel_sum(int64_t n, int64_t hw, int64_t stride, const F& f) {
  float total = 0.0f;
  for (int64_t p = 0; p < n; p++) total += lane_sum(hw, [&](int64_t i) { return f(p * stride + i); });
  return total;
}

template <typename F>
void over_channels(int64_t channels, const F& f) {
  if (executorch::extension::get_thread_count() <= 1 || channels < 2) return f(0, channels);
  executorch::extension::parallel_for(0, channels, 1, [&](int64_t c0, int64_t c1) { f(c0, c1); });
}

bool vector_of(const Tensor& t, int64_t c) { return plain_float(t) && sizes_are(t, {c}); }

bool switch_value(const Tensor& t, float& value) {
  if (!plain_float(t) || t.numel() != 1) return false;
  value = t.const_data_ptr<float>()[0];
  return true;
}

}  // namespace

// batch_norm.out(x, weight, bias, running_mean, running_var, t, momentum, eps, *, y, save_mean, save_invstd,
// new_mean, new_var): y = (x - mean) * (invstd * weight) + bias, with save_mean and save_invstd the statistics
// it normalised with (what the backward needs) and new_mean, new_var the running statistics after this batch
// (the variance's update unbiased, as torch's)
void batch_norm_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& in = stack[0]->toTensor();
  const int64_t c = in.dim() == 4 ? in.size(1) : 0;
  Tensor* out[5];
  for (int i = 0; i < 5; i++) out[i] = &stack[8 + i]->toTensor();
  float t = 0.0f;
  if (!plain_float(in) || c == 0 || !vector_of(stack[1]->toTensor(), c) || !vector_of(stack[2]->toTensor(), c) ||
      !vector_of(stack[3]->toTensor(), c) || !vector_of(stack[4]->toTensor(), c) ||
      !switch_value(stack[5]->toTensor(), t) || !plain_float(*out[0]) || !same_sizes(*out[0], in) ||
      !vector_of(*out[1], c) || !vector_of(*out[2], c) || !vector_of(*out[3], c) || !vector_of(*out[4], c)) {
    context.fail(executorch::runtime::Error::InvalidArgument);
    return;
  }
  const float momentum = static_cast<float>(stack[6]->toDouble()), eps = static_cast<float>(stack[7]->toDouble());
  const int64_t n = in.size(0), hw = in.size(2) * in.size(3), stride = c * hw, count = n * hw;
  const float* x = in.const_data_ptr<float>();
  const float* weight = stack[1]->toTensor().const_data_ptr<float>();
  const float* bias = stack[2]->toTensor().const_data_ptr<float>();
  const float* running_mean = stack[3]->toTensor().const_data_ptr<float>();
  const float* running_var = stack[4]->toTensor().const_data_ptr<float>();
  float* y = out[0]->mutable_data_ptr<float>();
  float* save_mean = out[1]->mutable_data_ptr<float>();
  float* save_invstd = out[2]->mutable_data_ptr<float>();
  float* new_mean = out[3]->mutable_data_ptr<float>();
  float* new_var = out[4]->mutable_data_ptr<float>();
  const float unbiased = static_cast<float>(static_cast<double>(count) / static_cast<double>(count > 1 ? count - 1 : 1));
  over_channels(c, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ch++) {
      const float* xc = x + ch * hw;
      const float batch_mean = channel_sum(n, hw, stride, [&](int64_t i) { return xc[i]; }) / static_cast<float>(count);
      const float mean = t * batch_mean + (1 - t) * running_mean[ch];
      const float batch_var = channel_sum(n, hw, stride, [&](int64_t i) {
                                const float d = xc[i] - mean;
                                return d * d;
                              }) / static_cast<float>(count);
      const float var = t * batch_var + (1 - t) * running_var[ch];
      const float invstd = 1.0f / std::sqrt(var + eps);
      const float scale = invstd * weight[ch], shift = bias[ch];
      for (int64_t p = 0; p < n; p++) {
        const float* __restrict src = xc + p * stride;
        float* __restrict dst = y + ch * hw + p * stride;
        for (int64_t i = 0; i < hw; i++) dst[i] = (src[i] - mean) * scale + shift;
      }
      save_mean[ch] = mean;
      save_invstd[ch] = invstd;
      new_mean[ch] = (1 - momentum) * running_mean[ch] + momentum * batch_mean;
      new_var[ch] = (1 - momentum) * running_var[ch] + momentum * (batch_var * unbiased);
    }
  });
  calls[kBatchNorm]++;
}

// batch_norm_backward.out(grad, x, weight, save_mean, save_invstd, t, *, grad_x, grad_weight, grad_bias):
// with xhat = (x - mean) * invstd, grad_bias = sum grad, grad_weight = sum grad * xhat, and grad_x
// = weight * invstd * (grad - grad_bias / count - xhat * grad_weight / count) through batch statistics (t = 1),
// weight * invstd * grad through running ones (t = 0)
void batch_norm_backward_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  const Tensor& grad = stack[0]->toTensor();
  const Tensor& in = stack[1]->toTensor();
  const int64_t c = in.dim() == 4 ? in.size(1) : 0;
  Tensor& dx_t = stack[6]->toTensor();
  Tensor& dw_t = stack[7]->toTensor();
  Tensor& db_t = stack[8]->toTensor();
  float t = 0.0f;
  if (!plain_float(in) || c == 0 || !plain_float(grad) || !same_sizes(grad, in) ||
      !vector_of(stack[2]->toTensor(), c) || !vector_of(stack[3]->toTensor(), c) ||
      !vector_of(stack[4]->toTensor(), c) || !switch_value(stack[5]->toTensor(), t) || !plain_float(dx_t) ||
      !same_sizes(dx_t, in) || !vector_of(dw_t, c) || !vector_of(db_t, c)) {
    context.fail(executorch::runtime::Error::InvalidArgument);
    return;
  }
  const int64_t n = in.size(0), hw = in.size(2) * in.size(3), stride = c * hw, count = n * hw;
  const float* dy = grad.const_data_ptr<float>();
  const float* x = in.const_data_ptr<float>();
  const float* weight = stack[2]->toTensor().const_data_ptr<float>();
  const float* save_mean = stack[3]->toTensor().const_data_ptr<float>();
  const float* save_invstd = stack[4]->toTensor().const_data_ptr<float>();
  float* dx = dx_t.mutable_data_ptr<float>();
  float* dw = dw_t.mutable_data_ptr<float>();
  float* db = db_t.mutable_data_ptr<float>();
  over_channels(c, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ch++) {
      const float* xc = x + ch * hw;
      const float* gc = dy + ch * hw;
      const float mean = save_mean[ch], invstd = save_invstd[ch];
      const float gb = channel_sum(n, hw, stride, [&](int64_t i) { return gc[i]; });
      const float gw = channel_sum(n, hw, stride, [&](int64_t i) { return gc[i] * ((xc[i] - mean) * invstd); });
      const float scale = weight[ch] * invstd;
      // through running statistics (t = 0) the batch's sums drop out
      const float mean_g = t * scale * (gb / static_cast<float>(count)),
                  mean_gx = t * scale * (gw / static_cast<float>(count));
      for (int64_t p = 0; p < n; p++) {
        const float* __restrict xs = xc + p * stride;
        const float* __restrict gs = gc + p * stride;
        float* __restrict out = dx + ch * hw + p * stride;
        for (int64_t i = 0; i < hw; i++) out[i] = scale * gs[i] - mean_g - ((xs[i] - mean) * invstd) * mean_gx;
      }
      dw[ch] = gw;
      db[ch] = gb;
    }
  });
  calls[kBatchNormBackward]++;
}

}  // namespace edgefl::kernels
