#include "fast_kernels.h"

#include <deque>
#include <string>
#include <vector>

#include "kernels_internal.h"

// Float32 kernels for the operators of edgefl's training programs where the shipped kernels spend most of a step:
// matrix products (the wheel's GEMM is Eigen built for the x86-64 baseline, 3-4x slower than the same source
// built for AVX2 + FMA or AVX-512: gemm.h), and data-moving and reducing operators that spend their time outside
// arithmetic: the shipped permute_copy computes a multi-dimensional index per element (16% of a CNN step under
// perf, before any product), their sum/mean walk reduced dimensions through per-element index arithmetic
// (get_init_index, 8%), their where/le (relu's backward) walk broadcast indices per element. These work on runs of
// contiguous memory instead.
//
// They take over through ExecuTorch's kernel keys: a kernel registered for a dtype and dim order wins over the
// fallback kernel the shipped library registers for the same operator, whatever the registration order. Each
// is registered for contiguous float32 tensors of the ranks it serves; any other case (a dtype argument, an
// empty tensor) goes to the shipped kernel, looked up as the registry's fallback. Copies, selections and
// elementwise arithmetic are exact (bit-equal to the shipped kernels); a sum over contiguous values adds them in
// 16 partial sums (kernels_reduce.cpp), the shipped kernel in one; products round as a blocked, fused-multiply-add
// GEMM does, not as the shipped one: trained tensors agree with the shipped kernels' and with torch's within the
// parity tolerance (tests/export/test_native_kernels.py).
//
// The kernels themselves: kernels_move.cpp (copies), kernels_reduce.cpp (reductions), kernels_matmul.cpp
// (products), kernels_conv.cpp (convolutions), kernels_pool.cpp (max pooling), kernels_binary.cpp (add, sub,
// mul), kernels_select.cpp (where, le), kernels_norm.cpp (edgefl::batch_norm and its backward);
// what they share: kernels_internal.h. This file registers them.
namespace edgefl {
namespace kernels {

Fallbacks& fallbacks() {
  static Fallbacks f;
  return f;
}
uint64_t calls[kOps] = {};

}  // namespace kernels

namespace {

using namespace kernels;

// Kernel key strings live as long as the registry (the process): it keeps pointers to them.
std::deque<std::string>& keys() {
  static std::deque<std::string> k;
  return k;
}

// an empty uint8 tensor of rank 1: what a program passes for an output the operator is told not to compute
constexpr int kUnwanted = 100;

// a tensor of a kernel key: dtype and rank (contiguous)
struct Meta {
  ScalarType type;
  int rank;
};

const char* key(const std::vector<Meta>& tensors) {
  static executorch::aten::DimOrderType order[kMaxRank] = {0, 1, 2, 3, 4, 5};
  std::vector<TensorMeta> metas;
  for (const Meta& t : tensors) metas.emplace_back(t.type, Span<executorch::aten::DimOrderType>(order, t.rank));
  char buf[executorch::runtime::internal::kKernelKeyBufSize];
  if (executorch::runtime::internal::make_kernel_key_string({metas.data(), metas.size()}, buf, sizeof buf) !=
      executorch::runtime::Error::Ok)
    return nullptr;
  keys().emplace_back(buf);
  return keys().back().c_str();
}

// ranks of contiguous float32 tensors; a negative rank -r: an int64 tensor of rank r (indices); kUnwanted
const char* key(const std::vector<int>& ranks) {
  std::vector<Meta> metas;
  for (int r : ranks)
    metas.push_back(r == kUnwanted ? Meta{ScalarType::Byte, 1} : r < 0 ? Meta{ScalarType::Long, -r}
                                                                       : Meta{ScalarType::Float, r});
  return key(metas);
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

// the max pool's backward, keyed (grad_output, self, indices, grad_input[, grad_input]), and edgefl's batch norm
bool register_fixes() {
  static bool done = false;
  if (done) return true;
  Fallbacks& f = fallbacks();
  f.max_pool_backward = shipped("aten::max_pool2d_with_indices_backward.grad_input");
  if (!f.max_pool_backward) return false;
  std::vector<Kernel> kernels;
  for (bool ret : {false, true})
    kernels.emplace_back("aten::max_pool2d_with_indices_backward.grad_input",
                         key(ret ? std::vector<int>{4, 4, -4, 4, 4} : std::vector<int>{4, 4, -4, 4}),
                         max_pool2d_backward_out);
  // edgefl's own operators (kernels_norm.cpp): no shipped kernel, so any key
  kernels.emplace_back("edgefl::batch_norm.out", batch_norm_out);
  kernels.emplace_back("edgefl::batch_norm_backward.out", batch_norm_backward_out);
  done = executorch::runtime::register_kernels({kernels.data(), kernels.size()}) == executorch::runtime::Error::Ok;
  return done;
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
  f.bmm = shipped("aten::bmm.out");
  f.mm = shipped("aten::mm.out");
  f.convolution = shipped("aten::convolution.out");
  f.convolution_backward = shipped("aten::convolution_backward.out");
  f.where = shipped("aten::where.self_out");
  f.le = shipped("aten::le.Scalar_out");
  f.expand = shipped("aten::expand_copy.out");
  f.max_pool = shipped("aten::max_pool2d_with_indices.out");
  f.add = shipped("aten::add.out");
  f.sub = shipped("aten::sub.out");
  f.mul = shipped("aten::mul.out");
  for (OpFunction op : {f.permute, f.sum, f.mean, f.slice, f.scatter, f.cat, f.bmm, f.mm, f.convolution,
                        f.convolution_backward, f.where, f.le, f.expand, f.max_pool, f.add, f.sub, f.mul})
    if (!op) return false;
  std::vector<Kernel> kernels;
  // a program's instruction lists the out variant's return value (the out tensor again) after its arguments,
  // and the key is made of every tensor there: (self, out, out); the key without it serves a call by name
  for (bool ret : {false, true}) {
    for (bool bias : {false, true}) {   // (input, weight[, bias], out[, out]): a missing bias is no tensor
      std::vector<int> ranks = bias ? std::vector<int>{4, 4, 1, 4} : std::vector<int>{4, 4, 4};
      if (ret) ranks.push_back(4);
      kernels.emplace_back("aten::convolution.out", key(ranks), convolution_out);
    }
    // (grad_output, input, weight, out0, out1, out2): the returned tensor list is no part of a key
    for (int grad_input : {4, kUnwanted})
      for (int grad_weight : {4, kUnwanted})
        for (int grad_bias : {1, kUnwanted})
          if (!ret)
            kernels.emplace_back("aten::convolution_backward.out",
                                 key({4, 4, 4, grad_input, grad_weight, grad_bias}), convolution_backward_out);
    // (self, out, indices[, out, indices]); int lists are no part of a key
    kernels.emplace_back("aten::max_pool2d_with_indices.out",
                         key(ret ? std::vector<int>{4, 4, -4, 4, -4} : std::vector<int>{4, 4, -4}), max_pool2d_out);
    for (int r : {3, 2})   // (self, mat2, out[, out])
      kernels.emplace_back(r == 3 ? "aten::bmm.out" : "aten::mm.out", key(std::vector<int>(ret ? 4 : 3, r)),
                           r == 3 ? bmm_out : mm_out);
  }
  // relu's backward: le(x, 0) then where(mask, 0, grad), the zero a rank-0 tensor
  constexpr ScalarType kBool = ScalarType::Bool, kFloat = ScalarType::Float;
  for (int r = 1; r <= kMaxRank; r++)
    for (bool ret : {false, true}) {
      std::vector<Meta> le = {{kFloat, r}, {kBool, r}};
      if (ret) le.push_back({kBool, r});
      kernels.emplace_back("aten::le.Scalar_out", key(le), le_scalar_out);
      for (int a : {0, r})
        for (int b : {0, r}) {
          std::vector<Meta> where = {{kBool, r}, {kFloat, a}, {kFloat, b}, {kFloat, r}};
          if (ret) where.push_back({kFloat, r});
          kernels.emplace_back("aten::where.self_out", key(where), where_out);
        }
    }
  // (self, other, out[, out]): a tensor, a single value or a vector on either side
  for (int r = 1; r <= kMaxRank; r++)
    for (bool ret : {false, true})
      for (int a : r == 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, r})
        for (int b : r == 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, r}) {
          std::vector<int> ranks = {a, b, r};
          if (ret) ranks.push_back(r);
          kernels.emplace_back("aten::add.out", key(ranks), add_out);
          kernels.emplace_back("aten::sub.out", key(ranks), sub_out);
          kernels.emplace_back("aten::mul.out", key(ranks), mul_out);
        }
  for (int r = 1; r <= kMaxRank; r++) {
    for (bool ret : {false, true}) {
      const std::vector<int> same = ret ? std::vector<int>{r, r, r} : std::vector<int>{r, r};
      for (int in = 0; in <= r; in++)       // (self, out[, out]): self of any rank up to out's
        kernels.emplace_back("aten::expand_copy.out", key(ret ? std::vector<int>{in, r, r} : std::vector<int>{in, r}),
                             expand_copy_out);
      kernels.emplace_back("aten::permute_copy.out", key(same), permute_copy_out);
      kernels.emplace_back("aten::slice_copy.Tensor_out", key(same), slice_copy_out);
      kernels.emplace_back("aten::slice_scatter.out", key(ret ? std::vector<int>{r, r, r, r} : std::vector<int>{r, r, r}),
                           slice_scatter_out);
      // a tensor list is no part of a kernel key
      kernels.emplace_back("aten::cat.out", key(ret ? std::vector<int>{r, r} : std::vector<int>{r}), cat_out);
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
