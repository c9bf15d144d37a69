#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "flow_scheduler_util.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {

FlowScheduler::FlowScheduler(int64_t num_train_timesteps)
    : num_train_timesteps_(num_train_timesteps) {}

void FlowScheduler::check_step_index(int64_t step_index) const {
  OMNI_CHECK(timesteps_.defined(), name(), "::step: call set_timesteps first");
  OMNI_CHECK(step_index >= 0 && step_index < num_inference_steps(), name(),
             "::step: step_index must be in [0, ", num_inference_steps(), "), got ", step_index);
}

at::Tensor FlowScheduler::add_noise(const at::Tensor& sample, const at::Tensor& noise,
                                    int64_t step_index) const {
  check_step_index(step_index);
  OMNI_CHECK(sample.sizes() == noise.sizes(), name(), "::add_noise: sample ", sample.sizes(),
             " and noise ", noise.sizes(), " differ in shape");
  const at::Tensor sigma = sigmas_[step_index].to(sample.scalar_type());
  return sigma * noise + (1.0 - sigma) * sample;
}

std::unique_ptr<FlowScheduler> load_flow_scheduler(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec)
                               ? (std::filesystem::path(path) / "scheduler_config.json").string()
                               : path;
  const HfConfig json = HfConfig::load(file);
  const std::string cls = json.get_string("_class_name");
  if (cls == "FlowMatchEulerDiscreteScheduler") {
    return std::make_unique<FlowMatchEulerScheduler>(FlowMatchEulerScheduler::parse_config(json));
  }
  if (cls == "UniPCMultistepScheduler") {
    return std::make_unique<UniPCMultistepScheduler>(UniPCMultistepScheduler::parse_config(json));
  }
  OMNI_THROW(file, ": field '_class_name' = \"", cls,
             "\": supported are FlowMatchEulerDiscreteScheduler and UniPCMultistepScheduler");
}

namespace flow_util {

void check_class_name(const HfConfig& json, const char* scheduler) {
  if (!json.has("_class_name")) return;
  const std::string cls = json.get_string("_class_name");
  OMNI_CHECK(cls == scheduler, json.source(), ": field '_class_name' = \"", cls, "\", expected \"",
             scheduler, "\"");
}

void check_known_fields(const HfConfig& json, const char* scheduler,
                        std::initializer_list<const char*> known) {
  for (const auto& item : json.raw().items()) {
    const std::string& key = item.key();
    if (!key.empty() && key[0] == '_') continue;
    bool found = false;
    for (const char* k : known) found = found || key == k;
    OMNI_CHECK(found, json.source(), ": field '", key, "' is not a ", scheduler,
               " setting this implementation knows (diffusers 0.42); it might change the "
               "schedule, so it is not ignored");
  }
}

void require_false(const HfConfig& json, const char* scheduler, const char* field,
                   const char* why) {
  OMNI_CHECK(!json.get_bool(field, false), json.source(), ": field '", field, "' = true is not ",
             "supported by ", scheduler, " here (", why, ")");
}

void require_null(const HfConfig& json, const char* scheduler, const char* field, const char* why) {
  OMNI_CHECK(!json.has(field), json.source(), ": field '", field,
             "' = ", json.raw().at(field).dump(), " is not supported by ", scheduler, " here (",
             why, "); only null");
}

std::string get_choice(const HfConfig& json, const char* scheduler, const char* field,
                       const char* fallback, std::initializer_list<const char*> allowed) {
  std::string value = json.get_string(field, fallback);
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return value;
    list += std::string(list.empty() ? "" : ", ") + "\"" + a + "\"";
  }
  OMNI_THROW(json.source(), ": field '", field, "' = \"", value, "\" is not supported by ",
             scheduler, " here; supported: ", list);
}

std::optional<double> get_optional_double(const HfConfig& json, const char* field) {
  if (!json.has(field)) return std::nullopt;
  return json.get_double(field);
}

void check_schedule(const char* scheduler, int64_t num_train_timesteps, const char* shift_name,
                    double shift) {
  OMNI_CHECK(num_train_timesteps >= 1, scheduler, ": num_train_timesteps must be >= 1, got ",
             num_train_timesteps);
  OMNI_CHECK(std::isfinite(shift) && shift > 0.0, scheduler, ": ", shift_name,
             " must be finite and > 0, got ", shift);
}

void check_num_steps(const char* scheduler, int64_t num_inference_steps) {
  OMNI_CHECK(num_inference_steps >= 1, scheduler,
             "::set_timesteps: num_inference_steps must be >= 1, got ", num_inference_steps);
}

std::vector<double> linspace(double start, double stop, int64_t num) {
  // numpy: start + i * ((stop - start) / (num - 1)), the last element exactly `stop`.
  std::vector<double> out(static_cast<size_t>(num), start);
  if (num < 2) return out;
  const double step = (stop - start) / static_cast<double>(num - 1);
  for (int64_t i = 1; i < num - 1; ++i) out[i] = static_cast<double>(i) * step + start;
  out.back() = stop;
  return out;
}

at::Tensor shift_sigmas(const at::Tensor& s, double shift) {
  return shift * s / (1 + (shift - 1) * s);
}

at::Tensor stretch_to_terminal(const at::Tensor& s, double terminal) {
  const at::Tensor one_minus = 1 - s;
  // diffusers divides by 1 - the last sigma: a schedule ending at 1 (one step of linspace(1, 1/N,
  // N)) gives NaN sigmas there, and NaN images after; say so instead.
  OMNI_CHECK(one_minus[-1].item<double>() != 0.0, "shift_terminal ", terminal,
             " cannot stretch a schedule whose last sigma is 1 (a "
             "single step from sigma 1): use 2 or more inference steps");
  const at::Tensor scale = one_minus[-1] / (1 - terminal);
  return 1 - one_minus / scale;
}

}  // namespace flow_util
}  // namespace omni::models
