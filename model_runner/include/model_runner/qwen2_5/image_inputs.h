// Image features into a Qwen2.5 decoder's input: the vision tower's merged embeddings take the
// places of the prompt's <|image_pad|> tokens. With rope_index's positions, the decoder's
// forward_embeds then runs a multimodal prompt as transformers' Qwen2_5_VLModel does:
//   embeds = splice_image_embeds(decoder.embed(ids), ids, tower.forward(pixels, grids), id);
//   hidden = decoder.forward_embeds(embeds, mask, rope_index(ids, mask, grids, ...).position_ids);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace omni::models::qwen2_5 {

// inputs_embeds [B, L, hidden] with the rows at image tokens (input_ids [B, L] ==
// image_token_id) replaced, in order (row after row), by image_embeds [n, hidden], converted to
// inputs_embeds' dtype and device (transformers' masked_scatter). Throws when the prompt's image
// tokens are not n or the widths differ.
at::Tensor splice_image_embeds(const at::Tensor& inputs_embeds, const at::Tensor& input_ids,
                               const at::Tensor& image_embeds, int64_t image_token_id);

}  // namespace omni::models::qwen2_5
