// The UMT5 text encoder of Wan2.1 / Wan2.2 (`text_encoder/`, transformers' UMT5EncoderModel):
// T5's encoder with a relative position bias in every layer instead of only the first. Built
// from the checkpoint's config.json, with the Hugging Face parameter names ("shared.weight",
// "encoder.block.3.layer.0.SelfAttention.q.weight", ...) so that load_weights binds a
// text_encoder/ checkpoint as it is. Gives transformers' last_hidden_state
// (tests/fixtures/umt5_tiny).
//
// Each encoder block (`encoder.block.{i}`) is a HookableModule, the unit the offload engine
// streams.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"

namespace omni::models {

class HfConfig;

struct UMT5Config {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t d_kv = 0;
  int64_t num_heads = 0;
  int64_t d_ff = 0;
  int64_t num_layers = 0;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;

  // Reads a UMT5 / T5 encoder config.json. Only the gated-GELU feed-forward
  // ("feed_forward_proj": "gated-gelu", gelu_new, as every UMT5 checkpoint) is supported; any
  // other setting throws naming the file, the field and its value.
  static UMT5Config parse(const HfConfig& json);
};

// T5's `_relative_position_bucket` for an encoder (bidirectional): [Lq, Lk] int64 buckets of
// key_position - query_position, on `device`.
at::Tensor umt5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                          int64_t num_buckets, int64_t max_distance,
                                          const at::Device& device);

// `layer.0.SelfAttention`: q, k, v, o without bias, and the layer's relative_attention_bias.
class UMT5Attention : public torch::nn::Module {
 public:
  UMT5Attention(const UMT5Config& c, at::ScalarType dtype);
  // x [B, L, d_model], buckets [L, L] int64, mask [B, 1, 1, L] additive (0 or the dtype's
  // lowest value).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& buckets, const at::Tensor& mask) const;

 private:
  int64_t heads_, d_kv_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
  std::shared_ptr<Embedding> relative_attention_bias_;
};

// `layer.0`: x + SelfAttention(layer_norm(x)).
class UMT5LayerSelfAttention : public torch::nn::Module {
 public:
  UMT5LayerSelfAttention(const UMT5Config& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& buckets, const at::Tensor& mask) const;

 private:
  std::shared_ptr<UMT5Attention> attention_;
  std::shared_ptr<RMSNorm> layer_norm_;
};

// `layer.1`: x + wo(gelu_new(wi_0(h)) * wi_1(h)), h = layer_norm(x).
class UMT5LayerFF : public torch::nn::Module {
 public:
  UMT5LayerFF(const UMT5Config& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::shared_ptr<torch::nn::Module> dense_;
  std::shared_ptr<Linear> wi_0_, wi_1_, wo_;
  std::shared_ptr<RMSNorm> layer_norm_;
};

// `encoder.block.{i}`.
class UMT5Block : public offload::HookableModule {
 public:
  UMT5Block(const UMT5Config& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& buckets, const at::Tensor& mask);

 private:
  std::shared_ptr<UMT5LayerSelfAttention> self_attention_;
  std::shared_ptr<UMT5LayerFF> ff_;
};

// UMT5EncoderModel: `shared` (the token embedding), `encoder.block`, `encoder.final_layer_norm`.
// Parameters are uninitialized until load_weights binds them (prefix ""). Hookable as a whole
// too, so that model-level offload can bring it to the device as a pipeline's `text_encoder`.
class UMT5Encoder : public offload::HookableModule {
 public:
  UMT5Encoder(const UMT5Config& c, at::ScalarType dtype);

  // input_ids [B, L] int64; attention_mask [B, L] (1 = token, 0 = padding; any integer or
  // bool dtype) or undefined for no padding. Returns last_hidden_state [B, L, d_model] in the
  // model's dtype; padded positions hold values too (as in transformers) that callers ignore.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {});

  const UMT5Config& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_->size()); }
  UMT5Block& block(int64_t i);

 private:
  at::Tensor forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask);

  UMT5Config config_;
  at::ScalarType dtype_;
  std::shared_ptr<Embedding> shared_;
  std::shared_ptr<torch::nn::Module> encoder_;
  torch::nn::ModuleList blocks_;
  std::shared_ptr<RMSNorm> final_layer_norm_;
};

// Builds the encoder from `<dir>/config.json` and binds the safetensors checkpoint in `dir`
// (model.safetensors or a sharded index) with load_weights: a missing, extra or misshapen
// tensor throws naming it. `dtype` Undefined means the checkpoint's dtype.
std::shared_ptr<UMT5Encoder> load_umt5_encoder(const std::string& dir,
                                               at::ScalarType dtype = at::ScalarType::Undefined);

}  // namespace omni::models
