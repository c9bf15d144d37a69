// What the Qwen2-VL family's vision towers share (Qwen2.5-VL's vision_tower.cc, Qwen3-Omni's
// vision_encoder.cc): the Conv3d patch embedding, the processor's patch order decoded into grid
// rows and columns, and the 2-D (axial) rotary embedding over them, written as transformers
// writes them so that the float rounding matches.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace omni::models::qwen2_5 {

// Where each patch of pixel_values lies. The processor's order: image by image, frame by frame,
// then the merge x merge blocks row-major, then the patches of a block row-major.
struct VisionPatchLayout {
  std::vector<int64_t> rows, cols;       // per patch: row / column in its image's patch grid
  std::vector<int64_t> heights, widths;  // per patch: that grid's height / width in patches
  std::vector<int64_t> frame_bounds;     // 0, then where each frame's patches end (cu_seqlens)
};

// `grid` holds (t, h, w) per image, flattened (the form the towers pass through their hooks).
// Throws when it is empty, not a multiple of 3, or holds a grid that is not positive or whose h
// or w is not a multiple of `merge`.
VisionPatchLayout vision_patch_layout(const std::vector<int64_t>& grid, int64_t merge);

// patch_embed.proj, a Conv3d whose kernel is its stride and the whole patch: pixel_values
// [N, C * T * P * P] -> [N, hidden], converted to the weight's device and dtype first. `weight`
// [hidden, C, T, P, P]; `bias` [hidden] or undefined.
at::Tensor embed_patches(const at::Tensor& pixel_values, const at::Tensor& weight,
                         const at::Tensor& bias);

// cos / sin [N, head_dim] float32 on `device` for patches at `rows`, `cols` ([N] int64, CPU):
// inverse frequencies over head_dim / 2, the row's angles then the column's, the half repeated
// (VisionRotaryEmbedding over get_vision_position_ids).
std::pair<at::Tensor, at::Tensor> vision_rope_cos_sin(const at::Tensor& rows,
                                                      const at::Tensor& cols, int64_t head_dim,
                                                      double theta, const at::Device& device);

// apply_rotary_pos_emb_vision on x [N, heads, head_dim]: in float32, back to x's dtype.
at::Tensor apply_vision_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace omni::models::qwen2_5
