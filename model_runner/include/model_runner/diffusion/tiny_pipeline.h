// A small text-to-image diffusion pipeline with the layout of the real ones (text encoder,
// DiT with self-attention / cross-attention / FFN blocks and adaLN modulation, VAE decoder,
// flow-matching Euler loop with classifier-free guidance). Deterministic from a seed. Used
// by the tests and offload-bench; its size is set by the config, from a few MB ("tiny") to
// DiT-sized ("wan14b": Wan2.1-14B's block shapes).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <string>

#include "cpu_offload/hooks.h"
#include "cpu_offload/model_spec.h"
#include "model_runner/layers.h"

namespace omni::models {

struct TinyDiffusionConfig {
  int64_t vocab = 64;
  int64_t text_dim = 64;
  int64_t text_layers = 2;
  int64_t text_heads = 4;
  int64_t dim = 64;  // DiT width
  int64_t heads = 4;
  int64_t blocks = 8;
  int64_t ffn_dim = 256;
  int64_t latent_channels = 4;
  int64_t latent_size = 8;  // latent is latent_size x latent_size
  int64_t patch = 2;
  int64_t vae_channels = 32;
  bool two_transformers = false;  // Wan2.2-style: transformer for early steps, transformer_2 after
  at::ScalarType dtype = at::kFloat;
  uint64_t seed = 0;

  // "tiny" (tests), "small" (CPU bench, ~0.4 GB), "wan14b" (Wan2.1-14B block shapes, bf16).
  static TinyDiffusionConfig preset(const std::string& name);
};

class TextEncoderLayer : public torch::nn::Module {
 public:
  TextEncoderLayer(const TinyDiffusionConfig& c, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t heads_;
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<Linear> qkv_, out_, fc1_, fc2_;
};

class TextEncoder : public offload::HookableModule {
 public:
  TextEncoder(const TinyDiffusionConfig& c, at::Generator& gen);
  at::Tensor forward(const at::Tensor& ids);

 private:
  std::shared_ptr<Embedding> embed_;
  torch::nn::ModuleList layers_;
  std::shared_ptr<LayerNorm> norm_;
};

// The three phases of a DiT block, each hookable so phase granularity can stream them.
class SelfAttentionPhase : public offload::HookableModule {
 public:
  SelfAttentionPhase(const TinyDiffusionConfig& c, at::Generator& gen);
  // attention(norm(x) * (1 + scale) + shift)
  at::Tensor forward(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

 private:
  int64_t heads_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> qkv_, out_;
};

class CrossAttentionPhase : public offload::HookableModule {
 public:
  CrossAttentionPhase(const TinyDiffusionConfig& c, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context);

 private:
  int64_t heads_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> q_, kv_, out_;
};

class FeedForwardPhase : public offload::HookableModule {
 public:
  FeedForwardPhase(const TinyDiffusionConfig& c, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

 private:
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> fc1_, fc2_;
};

class DiTBlock : public offload::HookableModule {
 public:
  DiTBlock(const TinyDiffusionConfig& c, at::Generator& gen);
  // temb: [B, 6, dim] modulation from the timestep.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& temb);

 private:
  at::Tensor modulation_;  // [6, dim], added to temb (Wan's per-block modulation table)
  std::shared_ptr<SelfAttentionPhase> self_attn_;
  std::shared_ptr<CrossAttentionPhase> cross_attn_;
  std::shared_ptr<FeedForwardPhase> ffn_;
};

class DiT : public offload::HookableModule {
 public:
  DiT(const TinyDiffusionConfig& c, at::Generator& gen);
  // latents [B, C, S, S], timestep [B] in [0, 1], context [B, L, text_dim] -> velocity.
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timestep,
                     const at::Tensor& context);

 private:
  TinyDiffusionConfig c_;
  std::shared_ptr<Linear> patch_embed_, text_proj_, time_fc1_, time_fc2_, time_proj_, proj_out_;
  at::Tensor pos_embed_;
  torch::nn::ModuleList blocks_;
  std::shared_ptr<LayerNorm> norm_out_;
};

class VaeDecoder : public offload::HookableModule {
 public:
  VaeDecoder(const TinyDiffusionConfig& c, at::Generator& gen);
  // latents [B, C, S, S] -> image [B, 3, 4S, 4S] in [-1, 1]. forward() is decode().
  at::Tensor decode(const at::Tensor& latents);
  at::Tensor forward(const at::Tensor& latents) { return decode(latents); }

 private:
  std::shared_ptr<Conv2d> conv_in_, up1_, up2_, conv_out_;
};

struct GenerateOptions {
  int steps = 4;
  double guidance_scale = 3.0;  // classifier-free guidance; 1 runs the conditional pass only
  uint64_t seed = 0;            // initial noise
  double boundary = 0.5;        // two_transformers: fraction of steps on `transformer`
};

class TinyDiffusionPipeline : public torch::nn::Module {
 public:
  explicit TinyDiffusionPipeline(const TinyDiffusionConfig& config);

  // prompt/negative: token ids [B, L]. Runs on `device`; returns images [B, 3, 4S, 4S].
  at::Tensor generate(const at::Tensor& prompt, const at::Tensor& negative,
                      const GenerateOptions& options, c10::Device device);

  // The components and block lists, for the offload engine.
  offload::ModelSpec offload_spec() const;
  const TinyDiffusionConfig& config() const { return config_; }

 private:
  TinyDiffusionConfig config_;
  std::shared_ptr<TextEncoder> text_encoder_;
  std::shared_ptr<DiT> transformer_, transformer_2_;
  std::shared_ptr<VaeDecoder> vae_;
};

// Deterministic token ids for tests and benches: [batch, length] in [0, vocab).
at::Tensor example_prompt(int64_t batch, int64_t length, int64_t vocab, uint64_t seed);

}  // namespace omni::models
