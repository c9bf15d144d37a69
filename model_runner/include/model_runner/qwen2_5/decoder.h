// The Qwen2.5 text decoder (transformers' Qwen2_5_VLTextModel): token embedding, decoder layers
// (RMSNorm, GQA attention with q/k/v bias and multimodal rope, SwiGLU MLP), final norm. A
// shared model part: Qwen-Image's text encoder runs it over a padded batch of prompts, the
// Qwen2.5-Omni thinker will run it too.
//
// Parameter names are those under the decoder's prefix on disk ("embed_tokens.weight",
// "layers.3.self_attn.q_proj.bias", "norm.weight"), so that load_weights binds a checkpoint as
// it is. Each decoder layer (`layers.{i}`) is a HookableModule, the unit the offload engine
// streams; the decoder is one too, so that model-level offload can move it as a component.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"
#include "model_runner/qwen2_5/config.h"

namespace omni::models {
class SafetensorsCheckpoint;
}

namespace omni::models::qwen2_5 {

// `self_attn`: q, k, v with bias, o without; no q/k norm.
class TextAttention : public torch::nn::Module {
 public:
  TextAttention(const TextConfig& c, at::ScalarType dtype);
  // x [B, L, hidden]; cos / sin [B, L, head_dim]; mask [B, 1, L, L] additive (0 where the key is
  // visible, the dtype's lowest value where not).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask) const;

 private:
  int64_t heads_, kv_heads_, head_dim_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

// `mlp`: down_proj(silu(gate_proj(x)) * up_proj(x)).
class TextMlp : public torch::nn::Module {
 public:
  TextMlp(const TextConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

// `layers.{i}`: x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)).
class DecoderLayer : public offload::HookableModule {
 public:
  DecoderLayer(const TextConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask);

 private:
  std::shared_ptr<TextAttention> self_attn_;
  std::shared_ptr<TextMlp> mlp_;
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
};

// The decoder, hookable methods "forward" and "embed". Parameters are uninitialized until
// load_weights binds them.
class TextDecoder : public offload::HookableModule {
 public:
  TextDecoder(const TextConfig& c, at::ScalarType dtype);

  // input_ids [B, L] int64; attention_mask [B, L] (1 = token, 0 = padding; any integer or bool
  // dtype) or undefined for none; position_ids [3, B, L] (temporal, height, width) or undefined
  // for text_position_ids (what transformers uses for text). Returns the last hidden state
  // [B, L, hidden] after the final norm, in the model's dtype (transformers' hidden_states[-1]).
  // Attention is causal and skips padded keys; padded positions hold values too, which callers
  // ignore.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {});
  // The same from input embeddings [B, L, hidden], for callers that splice other features in.
  at::Tensor forward_embeds(const at::Tensor& inputs_embeds, const at::Tensor& attention_mask = {},
                            const at::Tensor& position_ids = {});
  // Rows of the embedding table: [B, L] -> [B, L, hidden].
  at::Tensor embed(const at::Tensor& input_ids);

  const TextConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_->size()); }
  DecoderLayer& layer(int64_t i);

 private:
  at::Tensor run_layers(const at::Tensor& inputs_embeds, const at::Tensor& attention_mask,
                        const at::Tensor& position_ids);

  TextConfig config_;
  at::ScalarType dtype_;
  std::shared_ptr<Embedding> embed_tokens_;
  torch::nn::ModuleList layers_;
  std::shared_ptr<RMSNorm> norm_;
};

// The additive attention mask of a decoder over a padded batch: [B, 1, L, L] in `dtype`, 0
// where query i may see key j (j <= i and key j is not padding), the dtype's lowest value
// elsewhere. A finite value, as transformers' eager mask: a padded query that sees no key (left
// padding) gets finite values instead of NaN. attention_mask [B, L] or undefined (no padding).
at::Tensor causal_attention_mask(const at::Tensor& attention_mask, int64_t batch, int64_t length,
                                 at::ScalarType dtype, const at::Device& device);

// Where a checkpoint keeps the decoder: `root` + "model.language_model." where transformers
// 4.52+ in-memory names were saved, else `root` + "model." (the released Qwen2.5-VL and
// Qwen-Image text_encoder checkpoints, transformers 5's save_pretrained, Qwen2ForCausalLM).
// `root` is "" for a text_encoder/ folder ("thinker." for an Omni thinker). The rest
// (visual.*, lm_head) lies outside the prefix and is not loaded.
std::string decoder_prefix(const SafetensorsCheckpoint& checkpoint, const std::string& root = "");

// Builds the decoder from `<dir>/config.json` (TextConfig::parse) and binds the safetensors
// checkpoint in `dir` (model.safetensors or a sharded index) under decoder_prefix: a missing,
// extra or misshapen tensor throws naming it. `dtype` Undefined means the checkpoint's dtype.
std::shared_ptr<TextDecoder> load_text_decoder(const std::string& dir,
                                               at::ScalarType dtype = at::ScalarType::Undefined);

}  // namespace omni::models::qwen2_5
