#include "model_runner/qwen2_5/image_inputs.h"

#include <ATen/ATen.h>

#include "cpu_offload/check.h"

namespace omni::models::qwen2_5 {

at::Tensor splice_image_embeds(const at::Tensor& inputs_embeds, const at::Tensor& input_ids,
                               const at::Tensor& image_embeds, int64_t image_token_id) {
  OMNI_CHECK(inputs_embeds.dim() == 3 && input_ids.dim() == 2 &&
                 inputs_embeds.size(0) == input_ids.size(0) &&
                 inputs_embeds.size(1) == input_ids.size(1),
             "inputs_embeds [batch, length, hidden] must match input_ids [batch, length], got ",
             inputs_embeds.sizes(), " and ", input_ids.sizes());
  OMNI_CHECK(image_embeds.dim() == 2 && image_embeds.size(1) == inputs_embeds.size(2),
             "image embeddings must be [images' tokens, ", inputs_embeds.size(2),
             "] (the vision tower's out_hidden_size is the decoder's hidden size), got ",
             image_embeds.sizes());
  const auto mask = input_ids.to(inputs_embeds.device()).eq(image_token_id);
  const int64_t tokens = mask.sum().item<int64_t>();
  OMNI_CHECK(tokens == image_embeds.size(0), "the prompt holds ", tokens, " image tokens (id ",
             image_token_id, ") but the images give ", image_embeds.size(0), " embeddings");
  return inputs_embeds.masked_scatter(
      mask.unsqueeze(-1), image_embeds.to(inputs_embeds.device(), inputs_embeds.scalar_type()));
}

}  // namespace omni::models::qwen2_5
