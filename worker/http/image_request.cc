#include "worker/http/image_request.h"

#include <nlohmann/json.hpp>

#include "worker/http/diffusion_bounds.h"
#include "worker/http/request_json.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
using detail::field;

using detail::kMaxDiffusionPromptBytes;
// Qwen-Image's sides: the VAE's 8 x the transformer's 2 x 2 patches.
constexpr int64_t kSideMultiple = 16;

void parse_size(const std::string& s, ImageRequest& r) {
  const auto size = detail::parse_size(s, "size", detail::kMaxDiffusionSide, "1024x1024");
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
  const Json root = detail::parse_body(body, detail::diffusion_body_limits("an image prompt"));
  if (!root.is_object()) detail::wrong_type("", "a JSON object", root);
  detail::check_keys(root, "",
                     {"prompt", "model", "n", "size", "response_format", "negative_prompt",
                      "num_inference_steps", "true_cfg_scale", "seed"});
  ImageRequest r;
  const Json* prompt = field(root, "prompt");
  if (prompt == nullptr) detail::fail("prompt", "'prompt' is required", "missing_field");
  r.prompt = detail::get_text(*prompt, "prompt", kMaxDiffusionPromptBytes);
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
    d.negative_prompt = detail::get_text(*v, "negative_prompt", kMaxDiffusionPromptBytes);
  }
  if (const Json* v = field(root, "num_inference_steps")) {
    d.num_inference_steps =
        detail::get_int_in(*v, "num_inference_steps", 1, detail::kMaxDiffusionSteps);
  }
  if (const Json* v = field(root, "true_cfg_scale")) {
    d.true_cfg_scale = detail::get_number_in(*v, "true_cfg_scale", 0, detail::kMaxGuidance);
  }
  if (const Json* v = field(root, "seed")) d.seed = detail::get_seed(*v, "seed");
  return r;
}

ImageEditRequest parse_image_edit_form(const std::vector<FormField>& fields, int64_t max_images) {
  ImageEditRequest edit;
  std::vector<FormField> text;
  for (const auto& f : fields) {
    // OpenAI's SDK names one image "image" and each of a list "image[]".
    if (f.name == "image" || f.name == "image[]") {
      if (!f.file) detail::invalid_value("image", "must be an uploaded file (PNG or JPEG)");
      if (f.value.empty()) {
        detail::invalid_value(
            "image", "image " + std::to_string(edit.images.size() + 1) + " is an empty file");
      }
      edit.images.push_back({f.value});
    } else if (f.name == "mask") {
      detail::unsupported("mask",
                          "masks are not supported: the prompt says what to change in the image");
    } else if (f.file) {
      detail::unsupported(f.name, "only the images to edit are uploaded ('image')");
    } else {
      text.push_back(f);
    }
  }
  const auto given = static_cast<int64_t>(edit.images.size());
  if (given == 0)
    detail::fail("image", "'image' is required: the image(s) to edit", "missing_field");
  if (given > max_images) {
    detail::invalid_value("image", "this model edits at most " + std::to_string(max_images) +
                                       (max_images == 1 ? " image" : " images") + ", got " +
                                       std::to_string(given));
  }
  edit.request = parse_image_request(
      form_json(text, {"n", "num_inference_steps", "true_cfg_scale", "seed"}).dump());
  return edit;
}

}  // namespace omni::http
