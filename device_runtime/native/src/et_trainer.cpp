#include "et_trainer.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <executorch/extension/tensor/tensor.h>

#include "errors.h"
#include "et_log.h"
#include "npy.h"

namespace executorch::extension::threadpool {
// libexecutorch_threadpool's pool; the wheel ships its symbols but not this header.
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace edgefl {
namespace {

using executorch::aten::ScalarType;
using executorch::extension::from_blob;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

std::string describe(Error error, const std::string& path) {
  std::string why = executorch::runtime::to_string(error);
  if (error == Error::OperatorMissing) {
    const std::string missing = et_log_missing_operators();
    return path + ": the program needs operators the shipped ExecuTorch kernels lack (" +
           (missing.empty() ? why : missing) +
           "); re-export the set with this edgefl version, whose rewrites use only shipped kernels";
  }
  return path + ": ExecuTorch cannot load the program (" + why +
         "); the file is truncated or not an ExecuTorch program: re-export or re-download the artifact";
}

std::unique_ptr<Module> load(const std::string& program, const std::string& weights) {
  et_log_clear();
  auto module = weights.empty() ? std::make_unique<Module>(program, Module::LoadMode::File)
                                : std::make_unique<Module>(program, weights, Module::LoadMode::File);
  const Error error = module->load_method("forward");
  if (error != Error::Ok) throw UserError(describe(error, program));
  return module;
}

std::vector<int32_t> sizes(std::vector<int64_t> shape, int64_t batch) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < shape.size(); i++) out.push_back(static_cast<int32_t>(i == 0 && batch ? batch : shape[i]));
  return out;
}

// A whole (small) member of state.npz: BN statistics and batch counters.
std::vector<unsigned char> read_member(const NpyArray& a) {
  size_t n = a.itemsize;
  for (int64_t d : a.shape) n *= static_cast<size_t>(d);
  std::vector<unsigned char> out(n);
  std::ifstream in(a.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(a.data_offset));
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n)))
    throw UserError(a.path + ": truncated; re-export or re-download the artifact");
  return out;
}

TensorPtr tensor_of(const void* data, std::vector<int32_t> dims, ScalarType type) {
  return from_blob(const_cast<void*>(data), std::move(dims), type);
}

}  // namespace

EtTrainer::EtTrainer(const ArtifactSet& set, int threads) : set_(set), optimizer_(set.optimizer) {
  executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(static_cast<uint32_t>(threads));
  rows_ = set.suffix.batch;
  if (set.has_prefix) {
    prefix_ = load(set.prefix.file("model"), "");
    prefix_rows_ = set.prefix.batch;
  }
  features_ = set.suffix.inputs.size() - 1;  // every input before the labels
  input_bytes_per_example_ = set.model_input().dtype == "int64" ? 8 : 4;
  for (size_t i = 1; i < set.model_input().shape.size(); i++)
    input_bytes_per_example_ *= static_cast<size_t>(set.model_input().shape[i]);

  const std::string program = set.suffix.file("program");
  suffix_ = load(program, set.suffix.file("weights"));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto method = suffix_->method("forward");  // the one way to reach the parameters' runtime storage
#pragma GCC diagnostic pop
  if (!method.ok()) throw UserError(describe(method.error(), program));
  method_ = *method;
  auto names = suffix_->execute("__et_training_fqn_forward");
  if (!names.ok())
    throw UserError(program + ": no training metadata (__et_training_fqn_forward); re-export the set");
  for (const EValue& name : *names) {
    const std::string full(name.toString());
    auto attribute = method_->get_attribute(full);
    if (!attribute.ok()) throw UserError(program + ": parameter " + full + " is not in the program; re-export the set");
    order_.push_back(full.substr(set.key_prefix.size()));
    params_.push_back(attribute->mutable_data_ptr<float>());
    param_numel_.push_back(static_cast<size_t>(attribute->numel()));
  }

  const std::string state_path = set.suffix.file("statistics");
  auto state = npz_open(state_path);
  for (const std::string& name : set.statistics) {
    if (!state.count(name)) throw UserError(state_path + ": no statistic " + name + "; re-export the set");
    auto raw = read_member(state[name]);
    std::vector<float> values(raw.size() / state[name].itemsize);
    convert_rows(state[name].descr, raw.data(), values.size(), "float32", values.data());
    statistics_.push_back(std::move(values));
    statistic_shapes_.push_back(state[name].shape);
  }
  for (const TensorEntry& e : set.suffix.trainable) {
    if (e.kind != "counter") continue;
    if (!state.count(e.local)) throw UserError(state_path + ": no counter " + e.local + "; re-export the set");
    auto raw = read_member(state[e.local]);
    int64_t value = 0;
    convert_rows(state[e.local].descr, raw.data(), 1, "int64", &value);
    counters_.emplace_back(e.local, value);
  }
}

void EtTrainer::fill_features(const std::vector<unsigned char>& x, int64_t examples) {
  const size_t row = input_bytes_per_example_;
  // Padding (a short evaluation batch) repeats the first example: real values, and its rows are never counted.
  std::vector<unsigned char> padded;
  if (examples < rows_) {
    padded.assign(x.begin(), x.begin() + examples * row);
    for (int64_t i = examples; i < rows_; i++) padded.insert(padded.end(), x.begin(), x.begin() + row);
  }
  const unsigned char* batch = examples < rows_ ? padded.data() : x.data();
  // The program's own (memory-planned) input tensors: the batch's features are written there once, not
  // held by the trainer and copied in by set_input.
  std::vector<unsigned char*> inputs;
  for (size_t k = 0; k < features_; k++) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    auto& tensor = method_->mutable_input(k).toTensor();
#pragma GCC diagnostic pop
    inputs.push_back(static_cast<unsigned char*>(tensor.mutable_data_ptr()));
  }
  if (!prefix_) {
    std::memcpy(inputs[0], batch, static_cast<size_t>(rows_) * row);  // int64 tokens travel bit for bit
    return;
  }
  const ScalarType input_type = set_.model_input().dtype == "int64" ? ScalarType::Long : ScalarType::Float;
  std::vector<unsigned char> chunk;
  for (int64_t start = 0; start < rows_; start += prefix_rows_) {
    const int64_t n = std::min(prefix_rows_, rows_ - start);
    chunk.assign(batch + start * row, batch + (start + n) * row);
    for (int64_t i = n; i < prefix_rows_; i++) chunk.insert(chunk.end(), chunk.begin(), chunk.begin() + row);
    auto input = tensor_of(chunk.data(), sizes(set_.prefix.inputs[0].shape, prefix_rows_), input_type);
    auto result = prefix_->execute("forward", std::vector<EValue>{EValue(input)});
    if (!result.ok()) throw UserError(set_.prefix.file("model") + ": the prefix failed to run (" +
                                      std::string(executorch::runtime::to_string(result.error())) + ")");
    for (size_t k = 0; k < features_; k++) {
      const auto& t = (*result)[k].toTensor();
      const size_t per_row = t.nbytes() / static_cast<size_t>(prefix_rows_);
      std::memcpy(inputs[k] + start * per_row, t.const_data_ptr(), n * per_row);
    }
  }
}

std::vector<EValue> EtTrainer::run(const std::vector<unsigned char>& x, std::vector<int64_t>& labels,
                                   int64_t examples, bool train) {
  fill_features(x, examples);
  std::vector<TensorPtr> keep;
  keep.push_back(tensor_of(labels.data(), {static_cast<int32_t>(labels.size())}, ScalarType::Long));
  float switch_value = train ? 1.0f : 0.0f;
  keep.push_back(tensor_of(&switch_value, {}, ScalarType::Float));
  for (size_t i = 0; i < statistics_.size(); i++)
    keep.push_back(tensor_of(statistics_[i].data(), sizes(statistic_shapes_[i], 0), ScalarType::Float));
  const std::string program = set_.suffix.file("program");
  for (size_t i = 0; i < keep.size(); i++) {
    const Error error = method_->set_input(EValue(keep[i]), features_ + i);
    if (error != Error::Ok) throw UserError(program + ": the training program refused input " +
                                            std::to_string(features_ + i) + " (" +
                                            executorch::runtime::to_string(error) + "); re-export the set");
  }
  const Error error = method_->execute();
  if (error != Error::Ok) throw UserError(program + ": the training program failed to run (" +
                                          std::string(executorch::runtime::to_string(error)) + ")");
  std::vector<EValue> outputs;
  for (size_t i = 0; i < method_->outputs_size(); i++) outputs.push_back(method_->get_output(i));
  return outputs;
}

float EtTrainer::train_step(const std::vector<unsigned char>& x, const std::vector<int64_t>& y, float lr) {
  std::vector<int64_t> labels(y);
  auto outs = run(x, labels, rows_, true);
  const float loss = outs[0].toTensor().const_data_ptr<float>()[0];
  const size_t first_gradient = 2 + statistics_.size();
  for (size_t i = 0; i < statistics_.size(); i++) {
    const float* updated = outs[2 + i].toTensor().const_data_ptr<float>();
    std::copy(updated, updated + statistics_[i].size(), statistics_[i].begin());
  }
  for (size_t i = 0; i < params_.size(); i++)
    optimizer_.step(i, params_[i], outs[first_gradient + i].toTensor().const_data_ptr<float>(), param_numel_[i], lr);
  for (auto& counter : counters_) counter.second += 1;
  steps_++;
  return loss;
}

EtTrainer::Eval EtTrainer::eval_batch(const std::vector<unsigned char>& x, const std::vector<int64_t>& y,
                                      int64_t examples) {
  const size_t per_example = y.size() / static_cast<size_t>(examples);
  std::vector<int64_t> labels(y);
  labels.resize(static_cast<size_t>(rows_) * per_example, -100);
  auto outs = run(x, labels, examples, false);
  Eval result;
  for (int64_t t : y) result.counted += t != -100;
  if (result.counted) result.loss_sum = static_cast<double>(outs[0].toTensor().const_data_ptr<float>()[0]) * result.counted;
  const float* logits = outs[1].toTensor().const_data_ptr<float>();
  const int64_t classes = set_.classes;
  for (size_t r = 0; r < y.size(); r++) {
    if (y[r] == -100) continue;
    const float* row = logits + r * classes;
    result.correct += (std::max_element(row, row + classes) - row) == y[r];
  }
  return result;
}

FloatPieces EtTrainer::upload(std::vector<float>& counters) const {
  FloatPieces out;
  counters.clear();
  counters.reserve(set_.suffix.trainable.size());  // never reallocated: pieces point into it
  for (const TensorEntry& e : set_.suffix.trainable) {
    if (e.kind == "parameter") {
      const size_t i = std::find(order_.begin(), order_.end(), e.local) - order_.begin();
      if (i == order_.size() || param_numel_[i] != static_cast<size_t>(e.numel()))
        throw UserError(set_.suffix.folder + "/manifest.json: trained tensor " + e.local +
                        " is not a parameter of the program; re-export the set");
      out.emplace_back(params_[i], param_numel_[i]);
    } else if (e.kind == "statistic") {
      const size_t i = std::find(set_.statistics.begin(), set_.statistics.end(), e.local) - set_.statistics.begin();
      if (i == set_.statistics.size())
        throw UserError(set_.suffix.folder + "/manifest.json: statistic " + e.local + " is not one the program updates");
      out.emplace_back(statistics_[i].data(), statistics_[i].size());
    } else {
      for (const auto& counter : counters_)
        if (counter.first == e.local) {
          counters.push_back(static_cast<float>(counter.second));
          out.emplace_back(&counters.back(), 1);
        }
    }
  }
  return out;
}

}  // namespace edgefl
