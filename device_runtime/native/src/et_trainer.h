// An ExecuTorch artifact set loaded for training: the prefix's inference program (XNNPACK) and the
// suffix's joint forward/backward program, whose one method maps
//   (*features, labels, batch_statistics, *statistics) -> (loss, logits, *statistics', *gradients, *parameters)
// (docs/artifact-format.md). Parameters live in memory the runtime owns and are updated there in place;
// BN running statistics and batch counters are the trainer's, passed in and read back every step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>

#include "artifact_set.h"
#include "npy.h"
#include "optimizer.h"

namespace edgefl {

class EtTrainer {
 public:
  EtTrainer(const ArtifactSet& set, int threads);

  int64_t batch() const { return rows_; }
  int64_t steps() const { return steps_; }

  // One step on exactly batch() examples (x in the model input's dtype, y flat int64 targets): the loss
  // before the update.
  float train_step(const std::vector<unsigned char>& x, const std::vector<int64_t>& y, float lr);

  // Eval mode (running statistics, no update) on up to batch() examples: (summed loss over the counted
  // targets, counted targets, correct predictions).
  struct Eval {
    double loss_sum = 0;
    int64_t counted = 0, correct = 0;
  };
  Eval eval_batch(const std::vector<unsigned char>& x, const std::vector<int64_t>& y, int64_t examples);

  // The upload: every trainable tensor in manifest order, as float32 pieces read in place (parameters
  // from the runtime's memory, statistics from the trainer's): no copy of the model is ever made. Valid
  // until the next step; `counters` holds the batch counters as float32 for the pieces that point there.
  FloatPieces upload(std::vector<float>& counters) const;

 private:
  // The boundary state of `examples` rows of x (x itself when nothing is frozen), padded to the batch,
  // written into the suffix program's input tensors.
  void fill_features(const std::vector<unsigned char>& x, int64_t examples);
  std::vector<executorch::runtime::EValue> run(const std::vector<unsigned char>& x, std::vector<int64_t>& labels,
                                               int64_t examples, bool train);

  const ArtifactSet& set_;
  std::unique_ptr<executorch::extension::module::Module> prefix_, suffix_;
  executorch::runtime::Method* method_ = nullptr;
  int64_t rows_ = 0, prefix_rows_ = 0, steps_ = 0;
  size_t input_bytes_per_example_ = 0;
  size_t features_ = 0;                                // program inputs before the labels
  std::vector<std::string> order_;                     // parameters, in the program's gradient order
  std::vector<float*> params_;                         // their storage in the runtime's memory
  std::vector<size_t> param_numel_;
  std::vector<std::vector<float>> statistics_;         // in extra.statistics order
  std::vector<std::vector<int64_t>> statistic_shapes_;
  std::vector<std::pair<std::string, int64_t>> counters_;
  Optimizer optimizer_;
};

}  // namespace edgefl
