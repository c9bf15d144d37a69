#include "model_runner/qwen3_omni/vision_encoder.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_ops.h"
#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/audio_encoder.h"  // hf_activation

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
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  // apply_rotary_pos_emb_vision: in float32, back to the input dtype.
  const auto c = cos.unsqueeze(-2).to(at::kFloat), s = sin.unsqueeze(-2).to(at::kFloat);
  auto rope = [&](const at::Tensor& t) {
    auto f = t.to(at::kFloat);
    return ((f * c) + (rotate_half(f) * s)).to(t.scalar_type());
  };
  q = rope(q).transpose(0, 1);  // [heads, N, head_dim]
  k = rope(k).transpose(0, 1);
  v = v.transpose(0, 1);
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
  const int64_t m = cfg_.spatial_merge_size;
  const int64_t patch_dim =
      cfg_.in_channels * cfg_.temporal_patch_size * cfg_.patch_size * cfg_.patch_size;
  OMNI_CHECK(!grid.empty() && grid.size() % 3 == 0, "vision grid_thw needs (t, h, w) per image");
  OMNI_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == patch_dim,
             "pixel_values must be [patches, ", patch_dim, "], got sizes ", pixel_values.sizes());

  // Per patch, in the processor's order (frames, then m x m merge blocks row-major, then the
  // patches of a block row-major): its row and column in the image's patch grid, and the grid
  // size. get_vision_position_ids and get_vision_interpolation_indices_and_weights both
  // decode this order.
  std::vector<int64_t> rows, cols, heights, widths, cu_seqlens = {0};
  for (size_t i = 0; i < grid.size(); i += 3) {
    const int64_t t = grid[i], h = grid[i + 1], w = grid[i + 2];
    OMNI_CHECK(t > 0 && h > 0 && w > 0 && h % m == 0 && w % m == 0, "vision grid (", t, ", ", h,
               ", ", w, ") of image ", i / 3, " must be positive with h and w multiples of ",
               "spatial_merge_size ", m);
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t br = 0; br < h / m; ++br) {
        for (int64_t bc = 0; bc < w / m; ++bc) {
          for (int64_t ir = 0; ir < m; ++ir) {
            for (int64_t ic = 0; ic < m; ++ic) {
              rows.push_back(br * m + ir);
              cols.push_back(bc * m + ic);
              heights.push_back(h);
              widths.push_back(w);
            }
          }
        }
      }
      cu_seqlens.push_back(cu_seqlens.back() + h * w);  // one attention segment per frame
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  OMNI_CHECK(n == pixel_values.size(0), "grid_thw describes ", n, " patches but pixel_values has ",
             pixel_values.size(0));

  const auto dtype = patch_weight_.scalar_type();
  const auto device = patch_weight_.device();
  const auto longs = at::TensorOptions(at::kLong);
  const auto row_t = at::tensor(rows, longs), col_t = at::tensor(cols, longs);

  // Patch embedding: Conv3d with kernel = stride over each patch.
  auto hidden = at::conv3d(pixel_values.to(device)
                               .view({-1, cfg_.in_channels, cfg_.temporal_patch_size,
                                      cfg_.patch_size, cfg_.patch_size})
                               .to(dtype),
                           patch_weight_, patch_bias_,
                           /*stride=*/{cfg_.temporal_patch_size, cfg_.patch_size, cfg_.patch_size})
                    .view({-1, cfg_.hidden_size});

  // Learned positions: the square table resampled to each grid (bilinear, align_corners).
  auto [h_taps, h_weights] = bilinear_axis(row_t, at::tensor(heights, longs), grid_side_);
  auto [w_taps, w_weights] = bilinear_axis(col_t, at::tensor(widths, longs), grid_side_);
  auto indices = (h_taps.unsqueeze(2) * grid_side_ + w_taps.unsqueeze(1)).reshape({-1, 4});
  auto weights = (h_weights.unsqueeze(2) * w_weights.unsqueeze(1)).reshape({-1, 4});
  auto pos = (pos_embed_->forward(indices.to(device)) * weights.to(device).unsqueeze(2)).sum(1);
  hidden = hidden + pos.to(hidden.scalar_type());

  // Axial rope: angles of the row on the first quarter of the head dim, of the column on the
  // second, repeated for the second half. float32 throughout.
  const int64_t spatial_dim = head_dim_ / 2;
  auto exponents = at::arange(0, spatial_dim, 2, longs).to(at::kFloat) / spatial_dim;
  auto inv_freq = (1.0 / at::pow(cfg_.rope_theta, exponents)).to(device);
  auto position_ids = at::stack({row_t, col_t}, 1).to(device);        // [N, 2]
  auto freqs = position_ids.unsqueeze(-1).to(at::kFloat) * inv_freq;  // [N, 2, head_dim / 4]
  auto recompose = [](const at::Tensor& f) {
    auto hw = at::cat({f.select(1, 0), f.select(1, 1)}, -1);
    return at::cat({hw, hw}, -1);
  };
  const auto cos = recompose(freqs.cos()), sin = recompose(freqs.sin());

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
