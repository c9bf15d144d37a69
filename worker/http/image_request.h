// A POST /v1/images/generations body (OpenAI's images API, vLLM-Omni's extra fields), parsed and
// checked before the pipeline sees it: every refusal is a 400 naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model_runner/runner/diffusion_request.h"

namespace omni::http {

struct ImageRequest {
  std::string prompt;
  std::string model;  // empty: not given
  std::string size;   // "WxH" as given, empty when not
  // What the image stage is asked for (n is num_images); unset fields keep the model's defaults.
  models::DiffusionRequest diffusion;
};

// Images one request may ask for: OpenAI's limit of n.
constexpr int64_t kMaxImagesPerRequest = 10;

// Fields: prompt (required), model, n (1 to kMaxImagesPerRequest), size ("1024x1024": width x
// height, multiples of 16), response_format ("b64_json" only: "url" is refused, no files are
// stored), negative_prompt, num_inference_steps, true_cfg_scale, seed. Any other field is
// refused. Throws ApiException (400) naming the field.
ImageRequest parse_image_request(std::string_view body);

}  // namespace omni::http
