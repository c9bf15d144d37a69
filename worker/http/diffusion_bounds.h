// Bounds of the diffusion request parsers (video_request.cc, image_request.cc) against requests
// no server could hold (a 100k x 100k image), not the model's rules: the diffusion stage checks
// those (sizes divisible by 16, ...) and its refusal names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "worker/http/request_json.h"

namespace omni::http::detail {

constexpr int64_t kMaxDiffusionSide = 4096;
constexpr int64_t kMaxDiffusionSteps = 1000;
// Guidance beyond this makes nothing anyone asked for (diffusers' defaults are 1-12).
constexpr double kMaxGuidance = 100;
// The text encoders read 512 (Wan) or 1024 (Qwen-Image) tokens at most: longer text only costs
// memory while the request is held.
constexpr size_t kMaxDiffusionPromptBytes = 64 << 10;
// A request has about a dozen fields.
constexpr size_t kMaxDiffusionJsonValues = 1024;

// A diffusion body: flat, about a dozen fields, a prompt and a negative prompt ("a video prompt").
inline BodyLimits diffusion_body_limits(std::string what) {
  BodyLimits limits;
  limits.max_depth = 8;
  limits.max_values = kMaxDiffusionJsonValues;
  limits.text_keys = {"prompt", "negative_prompt"};
  limits.max_text_bytes = 2 * kMaxDiffusionPromptBytes;
  limits.text_param = "prompt";
  limits.text_why = std::move(what);
  return limits;
}

}  // namespace omni::http::detail
