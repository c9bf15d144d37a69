#include "model_runner/qwen2_5/vision_tower.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "cpu_offload/check.h"
#include "diffusion/module_tree.h"
#include "qwen2_5/vision_ops.h"
#include "qwen2_5/vision_windows.h"

namespace omni::models::qwen2_5 {

// RMSNorm's epsilon in every vision norm (fixed in the reference, not a config field).
constexpr double kVisionNormEps = 1e-6;

VisionBlock::VisionBlock(const VisionConfig& c, at::ScalarType dtype)
    : HookableModule("VisionBlock"), heads_(c.num_heads) {
  const int64_t d = c.hidden_size, inner = c.intermediate_size;
  norm1_ = child<RMSNorm>(*this, "norm1", d, dtype, kVisionNormEps);
  norm2_ = child<RMSNorm>(*this, "norm2", d, dtype, kVisionNormEps);
  auto attn = group(*this, "attn");
  if (c.split_qkv) {
    q_ = child<Linear>(*attn, "q", d, d, dtype, true);
    k_ = child<Linear>(*attn, "k", d, d, dtype, true);
    v_ = child<Linear>(*attn, "v", d, d, dtype, true);
  } else {
    qkv_ = child<Linear>(*attn, "qkv", d, 3 * d, dtype, true);
  }
  proj_ = child<Linear>(*attn, "proj", d, d, dtype, true);
  auto mlp = group(*this, "mlp");
  gate_proj_ = child<Linear>(*mlp, "gate_proj", d, inner, dtype, true);
  up_proj_ = child<Linear>(*mlp, "up_proj", d, inner, dtype, true);
  down_proj_ = child<Linear>(*mlp, "down_proj", inner, d, dtype, true);
}

at::Tensor VisionBlock::attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const std::vector<int64_t>& bounds) const {
  const int64_t n = x.size(0);
  at::Tensor q, k, v;  // [N, heads, head_dim]
  if (qkv_) {
    const auto qkv = qkv_->forward(x).reshape({n, 3, heads_, -1}).permute({1, 0, 2, 3});
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  } else {
    q = q_->forward(x).reshape({n, heads_, -1});
    k = k_->forward(x).reshape({n, heads_, -1});
    v = v_->forward(x).reshape({n, heads_, -1});
  }
  q = apply_vision_rope(q, cos, sin).transpose(0, 1);  // [heads, N, head_dim]
  k = apply_vision_rope(k, cos, sin).transpose(0, 1);
  v = v.transpose(0, 1);
  return proj_->forward(segment_attention(q, k, v, bounds));
}

at::Tensor VisionBlock::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                const at::Tensor& sin, const std::vector<int64_t>& bounds) {
  return invoke("forward", {hidden, cos, sin, c10::IValue(bounds)},
                [this](offload::HookArgs& a) -> c10::IValue {
                  const auto& h = a[0].toTensor();
                  const auto x = h + attention(norm1_->forward(h), a[1].toTensor(), a[2].toTensor(),
                                               a[3].toIntVector());
                  const auto y = norm2_->forward(x);
                  return x + down_proj_->forward(at::silu(gate_proj_->forward(y)) *
                                                 up_proj_->forward(y));
                })
      .toTensor();
}

VisionPatchMerger::VisionPatchMerger(const VisionConfig& c, at::ScalarType dtype)
    : torch::nn::Module("VisionPatchMerger"),
      merged_dim_(c.hidden_size * c.spatial_merge_size * c.spatial_merge_size) {
  ln_q_ = child<RMSNorm>(*this, "ln_q", c.hidden_size, dtype, kVisionNormEps);
  auto mlp = group(*this, "mlp");
  fc1_ = child<Linear>(*mlp, "0", merged_dim_, merged_dim_, dtype, true);
  fc2_ = child<Linear>(*mlp, "2", merged_dim_, c.out_hidden_size, dtype, true);
}

at::Tensor VisionPatchMerger::forward(const at::Tensor& hidden) const {
  return fc2_->forward(at::gelu(fc1_->forward(ln_q_->forward(hidden).view({-1, merged_dim_}))));
}

VisionTower::VisionTower(const VisionConfig& c, at::ScalarType dtype)
    : HookableModule("VisionTower"), config_(c), dtype_(dtype) {
  auto proj = group(*group(*this, "patch_embed"), "proj");
  patch_weight_ = proj->register_parameter(
      "weight",
      uninitialized(
          {c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}, dtype),
      false);
  auto blocks = group(*this, "blocks");
  for (int64_t i = 0; i < c.depth; ++i) {
    blocks_.push_back(child<VisionBlock>(*blocks, std::to_string(i), c, dtype));
  }
  merger_ = child<VisionPatchMerger>(*this, "merger", c, dtype);
}

VisionBlock& VisionTower::block(int64_t i) {
  OMNI_CHECK(i >= 0 && i < num_blocks(), "vision block ", i, " out of range (", num_blocks(),
             " blocks)");
  return *blocks_[static_cast<size_t>(i)];
}

at::Tensor VisionTower::forward(const at::Tensor& pixel_values,
                                const std::vector<std::array<int64_t, 3>>& grid_thw) {
  std::vector<int64_t> grid;
  grid.reserve(3 * grid_thw.size());
  for (const auto& thw : grid_thw) grid.insert(grid.end(), thw.begin(), thw.end());
  return invoke("forward", {pixel_values, c10::IValue(grid)},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return forward_impl(a[0].toTensor(), a[1].toIntVector());
                })
      .toTensor();
}

at::Tensor VisionTower::forward_impl(const at::Tensor& pixel_values,
                                     const std::vector<int64_t>& grid) {
  const int64_t merge = config_.spatial_merge_size, unit = merge * merge;
  const VisionPatchLayout layout = vision_patch_layout(grid, merge);
  const int64_t n = static_cast<int64_t>(layout.rows.size());
  auto hidden = embed_patches(pixel_values, patch_weight_, {});
  OMNI_CHECK(n == hidden.size(0), "grid_thw describes ", n, " patches but pixel_values has ",
             hidden.size(0));

  // The window order: merge^2-patch groups (a merged patch each) gathered window by window.
  const VisionWindows windows =
      vision_windows(grid, merge, config_.window_size, config_.patch_size);
  const auto device = hidden.device();
  const auto longs = at::TensorOptions(at::kLong);
  const auto order = at::tensor(windows.merged_order, longs);
  auto to_windows = [&](const at::Tensor& t, const at::Tensor& index) {
    return t.reshape({n / unit, unit, -1}).index_select(0, index).reshape({n, -1});
  };
  hidden = to_windows(hidden, order.to(device));
  // The rope of each patch, computed at its new place: the reference permutes cos / sin instead,
  // which gives the same numbers.
  const auto rows = to_windows(at::tensor(layout.rows, longs), order).view({n});
  const auto cols = to_windows(at::tensor(layout.cols, longs), order).view({n});
  const auto [cos, sin] =
      vision_rope_cos_sin(rows, cols, config_.head_dim, config_.rope_theta, device);

  // Windows and frames both keep each frame's patches in its own span, so the frame bounds hold
  // in the window order too.
  const auto& full = config_.fullatt_block_indexes;
  for (int64_t i = 0; i < num_blocks(); ++i) {
    const bool whole_frame = std::find(full.begin(), full.end(), i) != full.end();
    hidden = block(i).forward(hidden, cos, sin, whole_frame ? layout.frame_bounds : windows.bounds);
  }
  // Merged patches back to the processor's order.
  const auto restore = at::argsort(order).to(device);
  return merger_->forward(hidden).index_select(0, restore);
}

}  // namespace omni::models::qwen2_5
