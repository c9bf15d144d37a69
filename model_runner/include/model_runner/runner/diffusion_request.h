// What a request asks of a diffusion stage (Wan2.x): the prompt is the request's chat.text and
// the image its first image file; every field left unset keeps the pipeline's own default
// (models::WanRequest), so a command or an API only says what the user gave.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace omni::models {

struct DiffusionRequest {
  std::string negative_prompt;  // "" as diffusers when absent
  std::optional<int64_t> height, width, num_frames, num_inference_steps, max_sequence_length;
  std::optional<double> guidance_scale, guidance_scale_2, boundary_ratio, flow_shift;
  std::optional<uint64_t> seed;  // torch.Generator("cpu").manual_seed(seed); unset: 0
};

}  // namespace omni::models
