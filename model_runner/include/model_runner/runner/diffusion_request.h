// What a request asks of a diffusion stage (Wan2.x video, Qwen-Image images): the prompt is the
// request's chat.text and the image its first image file; every field left unset keeps the
// pipeline's own default (models::WanRequest, models::QwenImageRequest), so a command or an API
// only says what the user gave. A field a pipeline does not read is refused by its stage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace omni::models {

struct DiffusionRequest {
  // Unset: none (Wan then guides with "", as diffusers; Qwen-Image does not guide).
  std::optional<std::string> negative_prompt;
  std::optional<int64_t> height, width, num_frames, num_inference_steps, max_sequence_length;
  std::optional<double> guidance_scale, guidance_scale_2, boundary_ratio, flow_shift;
  // Qwen-Image: the true classifier-free guidance scale, and images per prompt.
  std::optional<double> true_cfg_scale;
  std::optional<int64_t> num_images;
  std::optional<uint64_t> seed;  // torch.Generator("cpu").manual_seed(seed); unset: 0
};

}  // namespace omni::models
