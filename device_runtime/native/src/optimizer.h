// The optimizer rules of edgefl's trainers (docs/artifact-format.md, "Optimizer"): torch.optim.SGD
// (momentum, weight decay, no dampening, no Nesterov) and torch.optim.AdamW, stepped in float32 in the
// order torch does, so a native run reaches the tensors the Python trainers reach.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace edgefl {

struct OptimizerSpec {
  std::string name = "sgd";  // sgd | adamw
  float momentum = 0.9f;
  float weight_decay = 1e-5f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
};

class Optimizer {
 public:
  explicit Optimizer(OptimizerSpec spec) : spec_(std::move(spec)) {}

  // One step of parameter `index` (its state is created on first use, as torch creates it lazily).
  void step(size_t index, float* w, const float* g, size_t n, float lr) {
    if (index >= first_.size()) {
      first_.resize(index + 1);
      second_.resize(index + 1);
      steps_.resize(index + 1, 0);
    }
    if (spec_.name == "adamw") {
      adamw(index, w, g, n, lr);
    } else {
      sgd(index, w, g, n, lr);
    }
  }

  // Bytes of optimizer state held: what the cost model counts as optimizer state.
  size_t state_bytes() const {
    size_t total = 0;
    for (size_t i = 0; i < first_.size(); i++) total += 4 * (first_[i].size() + second_[i].size());
    return total;
  }

 private:
  void sgd(size_t i, float* w, const float* g, size_t n, float lr) {
    const float wd = spec_.weight_decay, mu = spec_.momentum;
    std::vector<float>& buf = first_[i];
    const bool fresh = buf.empty();
    if (mu != 0.0f && fresh) buf.resize(n);
    // one loop per case, with no branch inside and no aliasing, so that it vectorizes (a CNN's fc weight is
    // 1.6 M values a step); the arithmetic is torch's, in its order
    auto run = [&](auto decay, auto momentum, auto first) {
      float* __restrict wr = w;
      const float* __restrict gr = g;
      float* __restrict b = buf.data();
      for (size_t k = 0; k < n; k++) {
        float d = decay ? gr[k] + wd * wr[k] : gr[k];
        // torch: the first step's buffer is the gradient itself, later ones buf * momentum + d
        if (momentum) d = b[k] = first ? d : b[k] * mu + d;
        wr[k] = wr[k] - lr * d;
      }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (wd != 0.0f) {
      if (mu == 0.0f) run(Yes{}, No{}, No{});
      else if (fresh) run(Yes{}, Yes{}, Yes{});
      else run(Yes{}, Yes{}, No{});
    } else {
      if (mu == 0.0f) run(No{}, No{}, No{});
      else if (fresh) run(No{}, Yes{}, Yes{});
      else run(No{}, Yes{}, No{});
    }
    steps_[i]++;
  }

  void adamw(size_t i, float* w, const float* g, size_t n, float lr) {
    std::vector<float>& m = first_[i];
    std::vector<float>& v = second_[i];
    if (m.empty()) {
      m.assign(n, 0.0f);
      v.assign(n, 0.0f);
    }
    const long step = ++steps_[i];
    const float b1 = spec_.beta1, b2 = spec_.beta2;
    // torch computes the bias corrections in double (Python floats) and casts where they meet tensors
    const double correction1 = 1.0 - std::pow(static_cast<double>(b1), step);
    const double correction2 = 1.0 - std::pow(static_cast<double>(b2), step);
    const float step_size = static_cast<float>(lr / correction1);
    const float correction2_sqrt = static_cast<float>(std::sqrt(correction2));
    const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * spec_.weight_decay);
    for (size_t k = 0; k < n; k++) {
      w[k] = w[k] * decay;
      m[k] = m[k] + (g[k] - m[k]) * (1.0f - b1);  // lerp, as torch's exp_avg.lerp_
      v[k] = v[k] * b2 + (1.0f - b2) * g[k] * g[k];
      const float denom = std::sqrt(v[k]) / correction2_sqrt + spec_.eps;
      w[k] = w[k] - step_size * (m[k] / denom);
    }
  }

  OptimizerSpec spec_;
  std::vector<std::vector<float>> first_, second_;  // SGD momentum / Adam moments
  std::vector<long> steps_;
};

}  // namespace edgefl
