#include "worker/diffusers/diffusion_params.h"

#include <nlohmann/json.hpp>
#include <optional>

namespace omni::pipeline {
namespace {

using Json = nlohmann::json;

template <typename T>
void put(Json& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}

template <typename T>
void get(const Json& j, const char* key, std::optional<T>& value) {
  if (j.contains(key) && !j.at(key).is_null()) value = j.at(key).get<T>();
}

}  // namespace

std::string DiffusionParams::to_json() const {
  const auto& r = request;
  Json j{{"prompt", prompt}};
  put(j, "negative_prompt", r.negative_prompt);
  put(j, "height", r.height);
  put(j, "width", r.width);
  put(j, "num_frames", r.num_frames);
  put(j, "num_inference_steps", r.num_inference_steps);
  put(j, "max_sequence_length", r.max_sequence_length);
  put(j, "guidance_scale", r.guidance_scale);
  put(j, "guidance_scale_2", r.guidance_scale_2);
  put(j, "boundary_ratio", r.boundary_ratio);
  put(j, "flow_shift", r.flow_shift);
  put(j, "true_cfg_scale", r.true_cfg_scale);
  put(j, "num_images", r.num_images);
  put(j, "seed", r.seed);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

DiffusionParams diffusion_params(const std::string& json) {
  try {
    const Json j = Json::parse(json);
    DiffusionParams p;
    auto& r = p.request;
    p.prompt = j.at("prompt").get<std::string>();
    get(j, "negative_prompt", r.negative_prompt);
    get(j, "height", r.height);
    get(j, "width", r.width);
    get(j, "num_frames", r.num_frames);
    get(j, "num_inference_steps", r.num_inference_steps);
    get(j, "max_sequence_length", r.max_sequence_length);
    get(j, "guidance_scale", r.guidance_scale);
    get(j, "guidance_scale_2", r.guidance_scale_2);
    get(j, "boundary_ratio", r.boundary_ratio);
    get(j, "flow_shift", r.flow_shift);
    get(j, "true_cfg_scale", r.true_cfg_scale);
    get(j, "num_images", r.num_images);
    get(j, "seed", r.seed);
    return p;
  } catch (const Json::exception& e) {
    throw StageError(StageError::Code::kInvalidArgument, "",
                     std::string("malformed diffusion parameters: ") + e.what());
  }
}

}  // namespace omni::pipeline
