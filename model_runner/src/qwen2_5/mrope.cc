#include "model_runner/qwen2_5/mrope.h"

#include <ATen/ATen.h>

#include <vector>

#include "cpu_offload/check.h"
#include "text_decoder_ops.h"

namespace omni::models::qwen2_5 {

std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const TextConfig& cfg,
                                                const at::Tensor& position_ids,
                                                at::ScalarType dtype) {
  OMNI_CHECK(position_ids.dim() == 3 && position_ids.size(0) == 3,
             "position ids must be [3, batch, length] (temporal, height, width), got ",
             position_ids.sizes());
  const auto inv_freq = rope_inv_freq(cfg.rope_theta, cfg.head_dim, position_ids.device());
  const auto freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [3, B, L, d/2]
  at::Tensor half;
  if (cfg.mrope_section.empty()) {
    half = freqs[0];
  } else {
    // Picking the angles before cos / sin gives the same numbers as the reference's picking
    // after, with a third of the work.
    std::vector<at::Tensor> parts;
    int64_t offset = 0;
    for (size_t s = 0; s < cfg.mrope_section.size(); ++s) {
      parts.push_back(freqs[static_cast<int64_t>(s % 3)].narrow(-1, offset, cfg.mrope_section[s]));
      offset += cfg.mrope_section[s];
    }
    half = at::cat(parts, -1);
  }
  const auto angles = at::cat({half, half}, -1);  // [B, L, d]
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

at::Tensor text_position_ids(int64_t batch, int64_t length, const at::Device& device) {
  return at::arange(length, at::TensorOptions(at::kLong).device(device))
      .view({1, 1, length})
      .expand({3, batch, length});
}

}  // namespace omni::models::qwen2_5
