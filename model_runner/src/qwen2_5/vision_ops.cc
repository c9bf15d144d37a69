#include "qwen2_5/vision_ops.h"

#include <ATen/ATen.h>

#include "cpu_offload/check.h"
#include "text_decoder_ops.h"

namespace omni::models::qwen2_5 {

VisionPatchLayout vision_patch_layout(const std::vector<int64_t>& grid, int64_t merge) {
  OMNI_CHECK(!grid.empty() && grid.size() % 3 == 0, "vision grid_thw needs (t, h, w) per image");
  VisionPatchLayout layout;
  layout.frame_bounds = {0};
  for (size_t i = 0; i < grid.size(); i += 3) {
    const int64_t t = grid[i], h = grid[i + 1], w = grid[i + 2];
    OMNI_CHECK(t > 0 && h > 0 && w > 0 && h % merge == 0 && w % merge == 0, "vision grid (", t,
               ", ", h, ", ", w, ") of image ", i / 3,
               " must be positive with h and w multiples of spatial_merge_size ", merge);
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t br = 0; br < h / merge; ++br) {
        for (int64_t bc = 0; bc < w / merge; ++bc) {
          for (int64_t ir = 0; ir < merge; ++ir) {
            for (int64_t ic = 0; ic < merge; ++ic) {
              layout.rows.push_back(br * merge + ir);
              layout.cols.push_back(bc * merge + ic);
              layout.heights.push_back(h);
              layout.widths.push_back(w);
            }
          }
        }
      }
      layout.frame_bounds.push_back(layout.frame_bounds.back() + h * w);
    }
  }
  return layout;
}

at::Tensor embed_patches(const at::Tensor& pixel_values, const at::Tensor& weight,
                         const at::Tensor& bias) {
  const int64_t hidden = weight.size(0), channels = weight.size(1), temporal = weight.size(2);
  const int64_t patch = weight.size(3);
  const int64_t patch_dim = channels * temporal * patch * patch;
  OMNI_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == patch_dim,
             "pixel_values must be [patches, ", patch_dim, "], got sizes ", pixel_values.sizes());
  const auto input = pixel_values.to(weight.device())
                         .view({-1, channels, temporal, patch, patch})
                         .to(weight.scalar_type());
  return at::conv3d(input, weight, bias, /*stride=*/{temporal, patch, patch}).view({-1, hidden});
}

std::pair<at::Tensor, at::Tensor> vision_rope_cos_sin(const at::Tensor& rows,
                                                      const at::Tensor& cols, int64_t head_dim,
                                                      double theta, const at::Device& device) {
  const int64_t spatial_dim = head_dim / 2;
  const auto exponents =
      at::arange(0, spatial_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) / spatial_dim;
  const auto inv_freq = (1.0 / at::pow(theta, exponents)).to(device);
  const auto position_ids = at::stack({rows, cols}, 1).to(device);          // [N, 2]
  const auto freqs = position_ids.unsqueeze(-1).to(at::kFloat) * inv_freq;  // [N, 2, head_dim / 4]
  auto recompose = [](const at::Tensor& f) {
    const auto hw = at::cat({f.select(1, 0), f.select(1, 1)}, -1);
    return at::cat({hw, hw}, -1);
  };
  return {recompose(freqs.cos()), recompose(freqs.sin())};
}

at::Tensor apply_vision_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto c = cos.unsqueeze(-2).to(at::kFloat), s = sin.unsqueeze(-2).to(at::kFloat);
  const auto f = x.to(at::kFloat);
  return ((f * c) + (rotate_half(f) * s)).to(x.scalar_type());
}

}  // namespace omni::models::qwen2_5
