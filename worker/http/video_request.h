// A POST /v1/videos body (OpenAI's video API, vLLM-Omni's fields and ours), parsed and checked
// before a job exists: every refusal is a 400 naming the field. JSON, or multipart/form-data as
// OpenAI's SDK sends it (request_guard.h admits forms only with an Authorization header).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model_runner/runner/diffusion_request.h"
#include "worker/http/form_fields.h"

namespace omni::http {

struct VideoRequest {
  std::string prompt;
  std::string model;  // empty: not given
  std::string size;   // "WxH" as given, empty when not
  std::optional<double> seconds;
  // What the diffusion stage is asked for; unset fields keep the model's defaults.
  models::DiffusionRequest diffusion;
};

// The largest 4k + 1 frames not above seconds * fps + 1 (Wan's VAE packs frames 1 + 4k), at
// least 1: 4 s at 16 fps is 65 frames.
int64_t frames_for_seconds(double seconds, int64_t fps);

// Fields: prompt (required), model, size ("832x480": width x height), seconds (a number or a
// numeric string, as OpenAI sends "4"; not with num_frames), num_frames, negative_prompt,
// num_inference_steps, guidance_scale, guidance_scale_2, boundary_ratio, flow_shift, seed.
// `fps` turns seconds into frames. Throws ApiException (400) naming the field.
VideoRequest parse_video_request(std::string_view body, int64_t fps);

// The same fields from a form: the numeric fields' values that read as JSON numbers are numbers,
// the rest strings (so "num_frames=abc" is refused as a string where an integer belongs). Uploads
// (OpenAI's input_reference image) and repeated fields are refused, naming the field.
VideoRequest parse_video_form(const std::vector<FormField>& fields, int64_t fps);

}  // namespace omni::http
