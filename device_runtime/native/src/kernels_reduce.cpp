// Reductions: sum, mean. A sum over a contiguous run of inputs (a mean over each channel's positions,
// the innermost dimensions) adds them in 16 interleaved partial sums, combined pairwise, then into
// the output (kernels_internal.h: lane_sum), where the shipped kernel adds them in input order. Other sums add
// in ascending input index.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels_internal.h"

namespace edgefl::kernels {

// Sums over the reduced dimensions: merged into alternating kept/reduced groups; an output over a reduced
// innermost group adds each run's lane_sum (kernels_internal.h), else its inputs in ascending input index.
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
      out[ob] += lane_sum(last, [row](int64_t i) { return row[i]; });
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

}  // namespace edgefl::kernels
