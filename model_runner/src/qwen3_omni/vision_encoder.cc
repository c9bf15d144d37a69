#include "model_runner/qwen3_omni/vision_encoder.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_ops.h"
#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/audio_encoder.h"  // hf_activation
#include "qwen2_5/vision_ops.h"

namespace omni::models::qwen3_omni {

using offload::HookArgs;

namespace {

// Per-axis bilinear taps and weights (transformers vision_utils
// _interpolation_axis_taps_weights, mode "bilinear", align_corners, border padding), float32
// with the reference's operation order. index, size: [N] int64 -> taps [N, 2] int64,
// weights [N, 2] float32.
std::pair<at::Tensor, at::Tensor> bilinear_axis(const at::Tensor& index, const at::Tensor& size,
                                                int64_t side) {
  auto src = index.to(at::kFloat) * (side - 1) / at::clamp_min(size - 1, 1);
  auto floor = at::floor(src);
  auto offsets = at::arange(0, 2, at::TensorOptions(at::kLong));
  auto taps = (floor.to(at::kLong).unsqueeze(1) + offsets).clamp(0, side - 1);
  auto distance = (src.unsqueeze(1) - floor.unsqueeze(1) - offsets).abs();
  auto weights = (1 - distance).clamp_min(0);
  return {taps, weights};
}

}  // namespace

// ---------------------------------------------------------------------------- block

VisionBlock::VisionBlock(const VisionEncoderConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("VisionBlock"), heads_(cfg.num_heads), hidden_act_(cfg.hidden_act) {
  const int64_t d = cfg.hidden_size;
  check_hf_activation(hidden_act_, "vision_config.hidden_act");
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(d, dtype, 1e-6));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(d, dtype, 1e-6));
  attn_ = register_module("attn", std::make_shared<torch::nn::Module>("VisionAttention"));
  qkv_ = attn_->register_module("qkv", std::make_shared<Linear>(d, 3 * d, dtype, true));
  proj_ = attn_->register_module("proj", std::make_shared<Linear>(d, d, dtype, true));
  mlp_ = register_module("mlp", std::make_shared<torch::nn::Module>("VisionMLP"));
  linear_fc1_ = mlp_->register_module(
      "linear_fc1", std::make_shared<Linear>(d, cfg.intermediate_size, dtype, true));
  linear_fc2_ = mlp_->register_module(
      "linear_fc2", std::make_shared<Linear>(cfg.intermediate_size, d, dtype, true));
}

at::Tensor VisionBlock::attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const std::vector<int64_t>& cu_seqlens) const {
  const int64_t n = x.size(0);
  // [N, 3 * d] -> 3 x [N, heads, head_dim]
  auto qkv = qkv_->forward(x).reshape({n, 3, heads_, -1}).permute({1, 0, 2, 3});
  const auto q = qwen2_5::apply_vision_rope(qkv[0], cos, sin).transpose(0, 1);  // [heads, N, d]
  const auto k = qwen2_5::apply_vision_rope(qkv[1], cos, sin).transpose(0, 1);
  const auto v = qkv[2].transpose(0, 1);
  return proj_->forward(segment_attention(q, k, v, cu_seqlens));
}

at::Tensor VisionBlock::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                const at::Tensor& sin, const std::vector<int64_t>& cu_seqlens) {
  return invoke("forward", {hidden, cos, sin, c10::IValue(cu_seqlens)},
                [this](HookArgs& a) -> c10::IValue {
                  const auto& h = a[0].toTensor();
                  const auto cu = a[3].toIntVector();
                  auto x = h + attention(norm1_->forward(h), a[1].toTensor(), a[2].toTensor(), cu);
                  return x + linear_fc2_->forward(hf_activation(
                                 hidden_act_, linear_fc1_->forward(norm2_->forward(x))));
                })
      .toTensor();
}

// ---------------------------------------------------------------------------- merger

VisionPatchMerger::VisionPatchMerger(const VisionEncoderConfig& cfg, bool postshuffle_norm,
                                     at::ScalarType dtype)
    : torch::nn::Module("VisionPatchMerger"),
      merged_dim_(cfg.hidden_size * cfg.spatial_merge_size * cfg.spatial_merge_size),
      postshuffle_norm_(postshuffle_norm) {
  ln_q_ = register_module(
      "ln_q",
      std::make_shared<LayerNorm>(postshuffle_norm ? merged_dim_ : cfg.hidden_size, dtype, 1e-6));
  mlp_ = register_module("mlp", std::make_shared<torch::nn::Module>("MergerMLP"));
  fc1_ =
      mlp_->register_module("0", std::make_shared<Linear>(merged_dim_, merged_dim_, dtype, true));
  fc2_ = mlp_->register_module(
      "2", std::make_shared<Linear>(merged_dim_, cfg.out_hidden_size, dtype, true));
}

at::Tensor VisionPatchMerger::forward(const at::Tensor& hidden) const {
  auto x = postshuffle_norm_ ? ln_q_->forward(hidden.reshape({-1, merged_dim_}))
                             : ln_q_->forward(hidden).reshape({-1, merged_dim_});
  return fc2_->forward(at::gelu(fc1_->forward(x)));
}

// ---------------------------------------------------------------------------- encoder

VisionEncoder::VisionEncoder(const VisionEncoderConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("VisionEncoder"), cfg_(cfg) {
  OMNI_CHECK(cfg.num_heads > 0 && cfg.hidden_size % cfg.num_heads == 0, "vision hidden_size ",
             cfg.hidden_size, " is not divisible by num_heads ", cfg.num_heads);
  head_dim_ = cfg.hidden_size / cfg.num_heads;
  OMNI_CHECK(head_dim_ % 4 == 0, "vision head_dim (hidden_size / num_heads = ", head_dim_,
             ") must be a multiple of 4 for the axial rope");
  grid_side_ = static_cast<int64_t>(std::llround(std::sqrt(cfg.num_position_embeddings)));
  OMNI_CHECK(grid_side_ * grid_side_ == cfg.num_position_embeddings,
             "vision num_position_embeddings ", cfg.num_position_embeddings,
             " is not a perfect square");
  OMNI_CHECK(cfg.spatial_merge_size > 0 && cfg.patch_size > 0 && cfg.temporal_patch_size > 0,
             "vision patch, temporal patch and merge sizes must be positive");
  for (int64_t index : cfg.deepstack_visual_indexes) {
    OMNI_CHECK(index >= 0 && index < cfg.depth, "vision deepstack_visual_indexes entry ", index,
               " is outside the ", cfg.depth, " blocks");
  }
  check_hf_activation(cfg.hidden_act, "vision_config.hidden_act");

  // Registered in the reference's order: merger_list, patch_embed, pos_embed, blocks, merger.
  merger_list_holder_ = register_module("merger_list", std::make_shared<torch::nn::Module>("List"));
  for (size_t i = 0; i < cfg.deepstack_visual_indexes.size(); ++i) {
    merger_list_.push_back(merger_list_holder_->register_module(
        std::to_string(i), std::make_shared<VisionPatchMerger>(cfg, true, dtype)));
  }
  patch_embed_ = register_module("patch_embed", std::make_shared<torch::nn::Module>("PatchEmbed"));
  auto proj = patch_embed_->register_module("proj", std::make_shared<torch::nn::Module>("Conv3d"));
  patch_weight_ = proj->register_parameter(
      "weight",
      uninitialized({cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size,
                     cfg.patch_size},
                    dtype),
      false);
  patch_bias_ = proj->register_parameter("bias", uninitialized({cfg.hidden_size}, dtype), false);
  pos_embed_ = register_module("pos_embed", std::make_shared<Embedding>(cfg.num_position_embeddings,
                                                                        cfg.hidden_size, dtype));
  blocks_holder_ = register_module("blocks", std::make_shared<torch::nn::Module>("Blocks"));
  for (int64_t i = 0; i < cfg.depth; ++i) {
    blocks_.push_back(blocks_holder_->register_module(std::to_string(i),
                                                      std::make_shared<VisionBlock>(cfg, dtype)));
  }
  merger_ = register_module("merger", std::make_shared<VisionPatchMerger>(cfg, false, dtype));
}

VisionOutput VisionEncoder::forward(const at::Tensor& pixel_values,
                                    const std::vector<std::array<int64_t, 3>>& grid_thw) {
  std::vector<int64_t> grid;
  grid.reserve(3 * grid_thw.size());
  for (const auto& thw : grid_thw) grid.insert(grid.end(), thw.begin(), thw.end());
  auto result =
      invoke("forward", {pixel_values, c10::IValue(grid)}, [this](HookArgs& a) -> c10::IValue {
        return forward_impl(a[0].toTensor(), a[1].toIntVector());
      });
  const auto& elements = result.toTupleRef().elements();
  VisionOutput out;
  out.embeds = elements.at(0).toTensor();
  for (size_t i = 1; i < elements.size(); ++i) out.deepstack.push_back(elements[i].toTensor());
  return out;
}

c10::IValue VisionEncoder::forward_impl(const at::Tensor& pixel_values,
                                        const std::vector<int64_t>& grid) {
  // Per patch, in the processor's order: its row and column in the image's patch grid, and the
  // grid size. get_vision_position_ids and get_vision_interpolation_indices_and_weights both
  // decode this order.
  const qwen2_5::VisionPatchLayout layout =
      qwen2_5::vision_patch_layout(grid, cfg_.spatial_merge_size);
  const int64_t n = static_cast<int64_t>(layout.rows.size());
  auto hidden = qwen2_5::embed_patches(pixel_values, patch_weight_, patch_bias_);
  OMNI_CHECK(n == hidden.size(0), "grid_thw describes ", n, " patches but pixel_values has ",
             hidden.size(0));

  const auto device = patch_weight_.device();
  const auto longs = at::TensorOptions(at::kLong);
  const auto row_t = at::tensor(layout.rows, longs), col_t = at::tensor(layout.cols, longs);

  // Learned positions: the square table resampled to each grid (bilinear, align_corners).
  auto [h_taps, h_weights] = bilinear_axis(row_t, at::tensor(layout.heights, longs), grid_side_);
  auto [w_taps, w_weights] = bilinear_axis(col_t, at::tensor(layout.widths, longs), grid_side_);
  auto indices = (h_taps.unsqueeze(2) * grid_side_ + w_taps.unsqueeze(1)).reshape({-1, 4});
  auto weights = (h_weights.unsqueeze(2) * w_weights.unsqueeze(1)).reshape({-1, 4});
  auto pos = (pos_embed_->forward(indices.to(device)) * weights.to(device).unsqueeze(2)).sum(1);
  hidden = hidden + pos.to(hidden.scalar_type());

  const auto [cos, sin] =
      qwen2_5::vision_rope_cos_sin(row_t, col_t, head_dim_, cfg_.rope_theta, device);
  const auto& cu_seqlens = layout.frame_bounds;  // one attention segment per frame

  const auto& indexes = cfg_.deepstack_visual_indexes;
  std::vector<c10::IValue> outputs(1);
  for (size_t layer = 0; layer < blocks_.size(); ++layer) {
    hidden = blocks_[layer]->forward(hidden, cos, sin, cu_seqlens);
    auto it = std::find(indexes.begin(), indexes.end(), static_cast<int64_t>(layer));
    if (it != indexes.end())
      outputs.emplace_back(merger_list_[it - indexes.begin()]->forward(hidden));
  }
  outputs[0] = merger_->forward(hidden);
  return c10::ivalue::Tuple::create(std::move(outputs));
}

}  // namespace omni::models::qwen3_omni
