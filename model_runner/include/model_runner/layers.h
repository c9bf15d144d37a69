// Small building blocks with Hugging Face tensor names (weight, bias), written on ATen so they
// stay cheap to compile. Weights are initialized from an explicit generator: a model built
// from the same seed is the same model.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <vector>

#include "cpu_offload/hooks.h"

namespace omni::models {

// N(0, std) on the CPU from `gen`, as `dtype`.
at::Tensor init_normal(at::IntArrayRef sizes, double std, at::Generator& gen, at::ScalarType dtype);

// Parameters of the right shape and dtype, left uninitialized: for modules whose weights are
// bound from a checkpoint (load_weights) right after construction.
at::Tensor uninitialized(at::IntArrayRef sizes, at::ScalarType dtype);

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out, at::Generator& gen, at::ScalarType dtype, bool bias = true);
  // Uninitialized, for checkpoint loading.
  Linear(int64_t in, int64_t out, at::ScalarType dtype, bool bias);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
};

// A Linear the offload engine can hook: for heads that are components of their own (lm_head,
// codec_head), whose weights must be on the device exactly while forward runs.
class HookableLinear : public offload::HookableModule {
 public:
  HookableLinear(int64_t in, int64_t out, at::ScalarType dtype, bool bias);  // uninitialized
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
};

class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, at::Generator& gen, at::ScalarType dtype, double eps = 1e-6);
  LayerNorm(int64_t dim, at::ScalarType dtype, double eps);  // uninitialized
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  double eps;
};

class Conv2d : public torch::nn::Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, at::Generator& gen, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t padding;
};

class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t vocab, int64_t dim, at::Generator& gen, at::ScalarType dtype);
  Embedding(int64_t vocab, int64_t dim, at::ScalarType dtype);  // uninitialized
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
};

// Qwen / T5 RMSNorm: normalizes in float32 whatever the input dtype, casts back, then scales
// (weight * x.to(input dtype)), as the Hugging Face reference does. Uninitialized weight.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, at::ScalarType dtype, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  const double eps;

 private:
  // eps and the width as float32 scalars: a double operand would be converted on every call.
  at::Tensor eps_f32_, width_f32_;
};

// softmax(q k^T / sqrt(d)) v over [B, heads, L, d] tensors, in a deterministic order.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Attention of the encoders (audio, vision): q, k, v [heads, N, head_dim] attend only inside each
// segment [cu_seqlens[i], cu_seqlens[i+1]) (cu_seqlens from 0 to N); returns [N, heads * head_dim].
// The reference's eager path: scores * head_dim^-0.5, softmax in float32, probabilities back
// to the input dtype, no mask. Consecutive segments of equal length run as one batch.
at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens);
// [B, L, heads*d] -> [B, heads, L, d] and back.
at::Tensor split_heads(const at::Tensor& x, int64_t heads);
at::Tensor merge_heads(const at::Tensor& x);

}  // namespace omni::models
