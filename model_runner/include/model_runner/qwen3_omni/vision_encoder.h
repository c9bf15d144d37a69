// The Qwen3-Omni thinker's vision encoder ("thinker.visual.*" on disk), as Hugging Face's
// Qwen3OmniMoeVisionEncoder: a Conv3d patch embedding, learned positions bilinearly resampled
// from a square grid to each image's grid, pre-norm blocks with axial 2D rope whose attention
// stays inside each frame, a patch merger (2x2 patches -> one token of the text hidden size),
// and DeepStack features: the hidden states after selected blocks through their own mergers.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"
#include "model_runner/qwen3_omni/config.h"

namespace omni::models::qwen3_omni {

struct VisionOutput {
  at::Tensor embeds;                  // [sum(t*h*w) / merge^2, out_hidden_size]
  std::vector<at::Tensor> deepstack;  // one per deepstack block (block order), same shape
};

// One pre-norm vision block; hookable so that the offload engine can stream blocks.
class VisionBlock : public offload::HookableModule {
 public:
  VisionBlock(const VisionEncoderConfig& cfg, at::ScalarType dtype);
  // hidden [N, hidden]; cos / sin [N, head_dim] float32; attention runs separately inside each
  // [cu_seqlens[i], cu_seqlens[i+1]).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens);

 private:
  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const std::vector<int64_t>& cu_seqlens) const;

  int64_t heads_;
  std::string hidden_act_;
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<torch::nn::Module> attn_, mlp_;
  std::shared_ptr<Linear> qkv_, proj_, linear_fc1_, linear_fc2_;
};

// LayerNorm, then Linear - GELU (exact) - Linear over groups of merge^2 consecutive patches.
// The main merger normalizes each patch (hidden); the DeepStack mergers normalize the merged
// group (use_postshuffle_norm, hidden * merge^2).
class VisionPatchMerger : public torch::nn::Module {
 public:
  VisionPatchMerger(const VisionEncoderConfig& cfg, bool postshuffle_norm, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& hidden) const;

 private:
  int64_t merged_dim_;
  bool postshuffle_norm_;
  std::shared_ptr<LayerNorm> ln_q_;
  std::shared_ptr<torch::nn::Module> mlp_;
  std::shared_ptr<Linear> fc1_, fc2_;  // mlp.0, mlp.2 (mlp.1 is the parameterless GELU)
};

class VisionEncoder : public offload::HookableModule {
 public:
  VisionEncoder(const VisionEncoderConfig& cfg, at::ScalarType dtype);

  // pixel_values [sum(t*h*w), in_channels * temporal_patch_size * patch_size^2], patches in
  // the processor's order (2x2 merge blocks, row-major); grid_thw per image or video. Inputs go
  // to the device and dtype of the weights.
  VisionOutput forward(const at::Tensor& pixel_values,
                       const std::vector<std::array<int64_t, 3>>& grid_thw);

  const VisionEncoderConfig& config() const { return cfg_; }

 private:
  c10::IValue forward_impl(const at::Tensor& pixel_values, const std::vector<int64_t>& grid);

  VisionEncoderConfig cfg_;
  int64_t head_dim_, grid_side_;
  std::shared_ptr<torch::nn::Module> patch_embed_;
  at::Tensor patch_weight_, patch_bias_;  // patch_embed.proj: Conv3d, kernel = stride
  std::shared_ptr<Embedding> pos_embed_;
  std::shared_ptr<torch::nn::Module> blocks_holder_, merger_list_holder_;
  std::vector<std::shared_ptr<VisionBlock>> blocks_;
  std::shared_ptr<VisionPatchMerger> merger_;
  std::vector<std::shared_ptr<VisionPatchMerger>> merger_list_;
};

}  // namespace omni::models::qwen3_omni
