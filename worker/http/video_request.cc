#include "worker/http/video_request.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "worker/http/diffusion_bounds.h"
#include "worker/http/request_json.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
using detail::field;

using detail::kMaxDiffusionSide;
using detail::kMaxDiffusionSteps;
using detail::kMaxGuidance;
constexpr int64_t kMaxFrames = 1025;
constexpr double kMaxSeconds = 600;
// Shift beyond this makes no video anyone asked for (diffusers' defaults are 1-12).
constexpr double kMaxFlowShift = 100;

const std::string& text_field(const Json& v, const std::string& param) {
  return detail::get_text(v, param, detail::kMaxDiffusionPromptBytes);
}

// "832x480" -> width 832, height 480.
void parse_size(const std::string& s, VideoRequest& r) {
  const auto size = detail::parse_size(s, "size", kMaxDiffusionSide, "832x480");
  r.size = s;
  r.diffusion.width = size.width;
  r.diffusion.height = size.height;
}

double parse_seconds(const Json& v) {
  double d = 0;
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    char* end = nullptr;
    d = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) {
      detail::invalid_value(
          "seconds", "must be a number of seconds (4 or \"4\"), got " + detail::quote_value(s));
    }
  } else {
    d = detail::get_number(v, "seconds");
  }
  if (!std::isfinite(d) || d <= 0 || d > kMaxSeconds) {
    detail::invalid_value("seconds",
                          "must be above 0 and at most " + std::to_string(int(kMaxSeconds)));
  }
  return d;
}

}  // namespace

int64_t frames_for_seconds(double seconds, int64_t fps) {
  const double n = seconds * static_cast<double>(fps) + 1;
  const auto k = static_cast<int64_t>(std::floor((n - 1) / 4));
  return k > 0 ? 4 * k + 1 : 1;
}

VideoRequest parse_video_request(std::string_view body, int64_t fps) {
  const Json root = detail::parse_body(body, detail::diffusion_body_limits("a video prompt"));
  if (!root.is_object()) detail::wrong_type("", "a JSON object", root);
  detail::check_keys(
      root, "",
      {"prompt", "model", "size", "seconds", "num_frames", "negative_prompt", "num_inference_steps",
       "guidance_scale", "guidance_scale_2", "boundary_ratio", "flow_shift", "seed"});
  VideoRequest r;
  const Json* prompt = field(root, "prompt");
  if (prompt == nullptr) detail::fail("prompt", "'prompt' is required", "missing_field");
  r.prompt = text_field(*prompt, "prompt");
  if (r.prompt.empty()) detail::invalid_value("prompt", "must not be empty");
  if (const Json* v = field(root, "model")) r.model = detail::get_string(*v, "model");
  if (const Json* v = field(root, "size")) parse_size(detail::get_string(*v, "size"), r);
  auto& d = r.diffusion;
  if (const Json* v = field(root, "negative_prompt")) {
    d.negative_prompt = text_field(*v, "negative_prompt");
  }
  if (const Json* v = field(root, "num_frames")) {
    d.num_frames = detail::get_int_in(*v, "num_frames", 1, kMaxFrames);
  }
  if (const Json* v = field(root, "seconds")) {
    // Two lengths that may disagree: refuse rather than pick one silently.
    if (d.num_frames) {
      detail::fail("seconds", "give 'seconds' or 'num_frames', not both", "invalid_value");
    }
    r.seconds = parse_seconds(*v);
    d.num_frames = std::min(frames_for_seconds(*r.seconds, fps), kMaxFrames);
  }
  if (const Json* v = field(root, "num_inference_steps")) {
    d.num_inference_steps = detail::get_int_in(*v, "num_inference_steps", 1, kMaxDiffusionSteps);
  }
  if (const Json* v = field(root, "guidance_scale")) {
    d.guidance_scale = detail::get_number_in(*v, "guidance_scale", 0, kMaxGuidance);
  }
  if (const Json* v = field(root, "guidance_scale_2")) {
    d.guidance_scale_2 = detail::get_number_in(*v, "guidance_scale_2", 0, kMaxGuidance);
  }
  if (const Json* v = field(root, "boundary_ratio")) {
    d.boundary_ratio = detail::get_number_in(*v, "boundary_ratio", 0, 1);
  }
  if (const Json* v = field(root, "flow_shift")) {
    const double s = detail::get_number_in(*v, "flow_shift", 0, kMaxFlowShift);
    if (s <= 0) detail::invalid_value("flow_shift", "must be above 0");
    d.flow_shift = s;
  }
  if (const Json* v = field(root, "seed")) d.seed = detail::get_seed(*v, "seed");
  return r;
}

VideoRequest parse_video_form(const std::vector<FormField>& fields, int64_t fps) {
  for (const auto& f : fields) {
    if (f.file) {
      detail::unsupported(f.name,
                          "file uploads (an input_reference image) are not supported: "
                          "send text fields only");
    }
  }
  const Json body =
      form_json(fields, {"seconds", "num_frames", "num_inference_steps", "guidance_scale",
                         "guidance_scale_2", "boundary_ratio", "flow_shift", "seed"});
  return parse_video_request(body.dump(), fps);
}

}  // namespace omni::http
