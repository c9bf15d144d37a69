// Qwen2-VL / Qwen2.5-VL's multimodal rotary position embedding: each token has a temporal, a
// height and a width position, and the head's frequencies are cut into three consecutive
// sections (mrope_section) that take their angle from one of them. Qwen3's interleaved variant
// is qwen3_omni::mrope_cos_sin.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "model_runner/qwen2_5/config.h"

namespace omni::models::qwen2_5 {

// cos / sin [B, L, head_dim] in `dtype` for position ids [3, B, L] (temporal, height, width),
// as Qwen2_5_VLRotaryEmbedding: angles in float32, frequency i of section s from axis s % 3,
// the half repeated. Without sections (a Qwen2 config) plain rope over position_ids[0].
std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const TextConfig& cfg,
                                                const at::Tensor& position_ids,
                                                at::ScalarType dtype);

// The positions transformers 5 gives a text-only batch [batch, length]: 0 .. length - 1 on all
// three axes of every row, whatever the padding (Qwen2_5_VLModel finds no image grid and
// leaves them to Qwen2_5_VLTextModel). With right padding, as Qwen-Image's tokenizer pads, a
// prompt's tokens thus get the positions they would have alone. [3, batch, length] int64.
at::Tensor text_position_ids(int64_t batch, int64_t length, const at::Device& device);

}  // namespace omni::models::qwen2_5
