#include "worker/http/image_request.h"

#include <nlohmann/json.hpp>

#include "worker/http/request_json.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
using detail::field;

// Bounds against requests no server could hold, as for video (video_request.cc).
constexpr int64_t kMaxSide = 4096;
constexpr int64_t kMaxSteps = 1000;
constexpr double kMaxGuidance = 100;
// Qwen-Image's sides: the VAE's 8 x the transformer's 2 x 2 patches.
constexpr int64_t kSideMultiple = 16;
// The text encoder reads 1024 tokens at most: longer text only costs memory.
constexpr size_t kMaxPromptBytes = 64 << 10;
// An image request has about ten fields.
constexpr size_t kMaxJsonValues = 1024;

void parse_size(const std::string& s, ImageRequest& r) {
  const auto size = detail::parse_size(s, "size", kMaxSide, "1024x1024");
  if (size.width % kSideMultiple != 0 || size.height % kSideMultiple != 0) {
    detail::invalid_value("size", "width and height must be multiples of " +
                                      std::to_string(kSideMultiple) + ", got " +
                                      detail::quote_value(s));
  }
  r.size = s;
  r.diffusion.width = size.width;
  r.diffusion.height = size.height;
}

void check_response_format(const std::string& format) {
  if (format == "b64_json") return;
  if (format == "url") {
    detail::unsupported("response_format",
                        "\"url\" is not supported: this server stores no image files; ask for "
                        "\"b64_json\"");
  }
  detail::invalid_value("response_format",
                        "must be \"b64_json\", got " + detail::quote_value(format));
}

}  // namespace

ImageRequest parse_image_request(std::string_view body) {
  detail::BodyLimits limits;
  limits.max_depth = 8;
  limits.max_values = kMaxJsonValues;
  limits.text_keys = {"prompt", "negative_prompt"};
  limits.max_text_bytes = 2 * kMaxPromptBytes;
  limits.text_param = "prompt";
  limits.text_why = "an image prompt";
  const Json root = detail::parse_body(body, limits);
  if (!root.is_object()) detail::wrong_type("", "a JSON object", root);
  detail::check_keys(root, "",
                     {"prompt", "model", "n", "size", "response_format", "negative_prompt",
                      "num_inference_steps", "true_cfg_scale", "seed"});
  ImageRequest r;
  const Json* prompt = field(root, "prompt");
  if (prompt == nullptr) detail::fail("prompt", "'prompt' is required", "missing_field");
  r.prompt = detail::get_text(*prompt, "prompt", kMaxPromptBytes);
  if (r.prompt.empty()) detail::invalid_value("prompt", "must not be empty");
  if (const Json* v = field(root, "model")) r.model = detail::get_string(*v, "model");
  if (const Json* v = field(root, "response_format")) {
    check_response_format(detail::get_string(*v, "response_format"));
  }
  if (const Json* v = field(root, "size")) parse_size(detail::get_string(*v, "size"), r);
  auto& d = r.diffusion;
  if (const Json* v = field(root, "n"))
    d.num_images = detail::get_int_in(*v, "n", 1, kMaxImagesPerRequest);
  if (const Json* v = field(root, "negative_prompt")) {
    d.negative_prompt = detail::get_text(*v, "negative_prompt", kMaxPromptBytes);
  }
  if (const Json* v = field(root, "num_inference_steps")) {
    d.num_inference_steps = detail::get_int_in(*v, "num_inference_steps", 1, kMaxSteps);
  }
  if (const Json* v = field(root, "true_cfg_scale")) {
    d.true_cfg_scale = detail::get_number_in(*v, "true_cfg_scale", 0, kMaxGuidance);
  }
  if (const Json* v = field(root, "seed")) d.seed = detail::get_seed(*v, "seed");
  return r;
}

}  // namespace omni::http
