// The Qwen2.5-VL vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel): a Conv3d
// patch embedding, pre-norm blocks (RMSNorm, attention with 2-D rope, SwiGLU MLP with biases)
// that attend inside windows except the fullatt_block_indexes blocks, which attend over the
// whole frame, and a patch merger (2x2 patches -> one token of the text hidden size). A shared
// model part: Qwen-Image-Edit's text encoder and the Qwen2.5-Omni thinker run it.
//
// Parameter names are those under the tower's prefix on disk ("patch_embed.proj.weight",
// "blocks.3.attn.qkv.weight", "merger.ln_q.weight"). Each block (`blocks.{i}`) is a
// HookableModule, the unit the offload engine streams; the tower is one too, so that
// model-level offload can move it as a component.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"
#include "model_runner/qwen2_5/vision_config.h"

namespace omni::models {
class SafetensorsCheckpoint;
}

namespace omni::models::qwen2_5 {

// `blocks.{i}`: x + attn(norm1(x)), then + mlp(norm2(x)); attn is `qkv` (or `q`, `k`, `v`) then
// `proj`, mlp is down_proj(silu(gate_proj(x)) * up_proj(x)), all with biases.
class VisionBlock : public offload::HookableModule {
 public:
  VisionBlock(const VisionConfig& c, at::ScalarType dtype);
  // hidden [N, hidden]; cos / sin [N, head_dim] float32; attention runs separately inside each
  // [bounds[i], bounds[i + 1]) (a window or a frame).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& bounds);

 private:
  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const std::vector<int64_t>& bounds) const;

  int64_t heads_;
  std::shared_ptr<RMSNorm> norm1_, norm2_;
  std::shared_ptr<Linear> qkv_, q_, k_, v_;  // qkv_, or q_, k_, v_ with split_qkv
  std::shared_ptr<Linear> proj_, gate_proj_, up_proj_, down_proj_;
};

// `merger`: ln_q (RMSNorm) on each patch, then mlp.0 - GELU (exact) - mlp.2 over groups of
// merge^2 consecutive patches.
class VisionPatchMerger : public torch::nn::Module {
 public:
  VisionPatchMerger(const VisionConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& hidden) const;

 private:
  int64_t merged_dim_;
  std::shared_ptr<RMSNorm> ln_q_;
  std::shared_ptr<Linear> fc1_, fc2_;  // mlp.0, mlp.2 (mlp.1 is the parameterless GELU)
};

// The tower, hookable method "forward". Parameters are uninitialized until load_weights binds
// them.
class VisionTower : public offload::HookableModule {
 public:
  VisionTower(const VisionConfig& c, at::ScalarType dtype);

  // pixel_values [sum(t * h * w), in_channels * temporal_patch_size * patch_size^2] in the
  // processor's order (image_to_patches, concatenated), grid_thw its (t, h, w) per image.
  // Returns the merged image embeddings [sum(t * h * w) / merge^2, out_hidden_size] in the
  // processor's order, in the model's dtype on its device (transformers' pooler_output): the
  // rows an image's <|image_pad|> tokens take, image after image.
  at::Tensor forward(const at::Tensor& pixel_values,
                     const std::vector<std::array<int64_t, 3>>& grid_thw);

  const VisionConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  VisionBlock& block(int64_t i);

 private:
  at::Tensor forward_impl(const at::Tensor& pixel_values, const std::vector<int64_t>& grid);

  VisionConfig config_;
  at::ScalarType dtype_;
  at::Tensor patch_weight_;  // patch_embed.proj: Conv3d without bias, kernel = stride
  std::vector<std::shared_ptr<VisionBlock>> blocks_;
  std::shared_ptr<VisionPatchMerger> merger_;
};

// Where a checkpoint keeps the tower: `root` + "model.visual." where transformers 4.52+
// in-memory names were saved, else `root` + "visual." (the released Qwen2.5-VL and Qwen-Image
// text_encoder checkpoints, transformers 5's save_pretrained). `root` is "" for a Qwen2.5-VL
// folder ("thinker." for an Omni thinker).
std::string vision_prefix(const SafetensorsCheckpoint& checkpoint, const std::string& root = "");

// Builds the tower from `<dir>/config.json` (VisionConfig::parse; split_qkv also where the
// checkpoint holds blocks.0.attn.q.weight) and binds the safetensors checkpoint in `dir` under
// vision_prefix: a missing, extra or misshapen tensor throws naming it. `dtype` Undefined means
// the checkpoint's dtype.
std::shared_ptr<VisionTower> load_vision_tower(const std::string& dir,
                                               at::ScalarType dtype = at::ScalarType::Undefined);

}  // namespace omni::models::qwen2_5
