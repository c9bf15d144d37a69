// Multimodal rope positions of a thinker prompt (Hugging Face `get_rope_index`, one sequence):
// text, audio and the start/end markers advance one position per token on all three axes; an
// image's tokens get (t * position_id_per_seconds, row, column) of its merged patch grid, offset
// by the position where the image starts; the token after an image continues from the largest
// position used + 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "model_runner/qwen3_omni/config.h"

namespace omni::models::qwen3_omni {

struct RopePositions {
  at::Tensor position_ids;  // [3, L] int64 (CPU)
  // Generated token n (0-based) takes position L + n + rope_delta on all three axes.
  int64_t rope_delta = 0;
};

// `image_grids` (t, h, w in patches) in the order the images appear. Throws when the image
// tokens do not match the grids, or for video tokens (not supported yet).
RopePositions rope_positions(const RopeIndexIds& ids, const std::vector<int64_t>& input_ids,
                             const std::vector<std::array<int64_t, 3>>& image_grids);
// With the thinker's ids.
RopePositions rope_positions(const ThinkerConfig& cfg, const std::vector<int64_t>& input_ids,
                             const std::vector<std::array<int64_t, 3>>& image_grids);

}  // namespace omni::models::qwen3_omni
