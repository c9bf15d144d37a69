// A POST /v1/images/generations body (OpenAI's images API, vLLM-Omni's extra fields) and a
// POST /v1/images/edits form, parsed and checked before the pipeline sees them: every refusal is
// a 400 naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model_runner/runner/diffusion_request.h"
#include "worker/http/form_fields.h"

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

struct ImageEditRequest {
  ImageRequest request;
  // The uploaded files, in the form's order (decoded by the image stage, which refuses what is
  // not a PNG or JPEG).
  struct Image {
    std::string data;
  };
  std::vector<Image> images;
};

// The form of an edit: `image` (or OpenAI's list form `image[]`) uploads, 1 to `max_images`,
// and the text fields of parse_image_request (numbers as form values). A `mask`, another upload,
// an empty image or a text `image` are refused. Throws ApiException (400) naming the field.
ImageEditRequest parse_image_edit_form(const std::vector<FormField>& fields, int64_t max_images);

}  // namespace omni::http
