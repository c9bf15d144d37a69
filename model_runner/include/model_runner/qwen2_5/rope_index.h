// Qwen2.5-VL's multimodal rope positions for a prompt batch holding images (transformers 5.24's
// Qwen2_5_VLModel.get_rope_index, given the processor's mm_token_type_ids: 1 at <|image_pad|>):
// text tokens advance one position on all three axes; an image's tokens take
// (start + frame, start + row, start + column) over its merged patch grid, where start is the
// position the image begins at, and the text after it continues at start + max(rows, columns).
//
// Without mm_token_type_ids transformers 5 computes none of this and numbers every token
// 0 .. L - 1 (what diffusers 0.42.1's QwenImageEditPipeline gets, diffusers#14194); these are
// the positions the model was trained with.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "model_runner/qwen2_5/vision_config.h"

namespace omni::models::qwen2_5 {

struct RopeIndex {
  // [3, B, L] int64 (temporal, height, width) on the CPU; 0 at padding.
  at::Tensor position_ids;
  // [B, 1] int64: the token after a row's v tokens (generated token n at index v + n) takes
  // position v + n + rope_delta on all three axes.
  at::Tensor rope_deltas;
};

// input_ids [B, L]; attention_mask [B, L] (1 = token, 0 = padding, either side) or undefined for
// none; image_grid_thw (t, h, w in patches) per image in the order the images appear, row after
// row. Each image is one run of t * h * w / merge^2 image tokens. Throws when the runs do not
// match the grids (count or number of images), or for video tokens (not supported).
RopeIndex rope_index(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                     const std::vector<std::array<int64_t, 3>>& image_grid_thw,
                     const ImageTokenIds& tokens, int64_t spatial_merge_size);

}  // namespace omni::models::qwen2_5
