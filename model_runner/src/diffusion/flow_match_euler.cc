// diffusers' FlowMatchEulerDiscreteScheduler (0.42): the static shift Wan2.1 uses and the dynamic
// shift (mu from the image's size) of Qwen-Image and FLUX.
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "flow_scheduler_util.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

constexpr const char* kName = "FlowMatchEulerDiscreteScheduler";

}  // namespace

FlowMatchEulerScheduler::Config FlowMatchEulerScheduler::parse_config(const HfConfig& json) {
  using namespace flow_util;
  check_class_name(json, kName);
  check_known_fields(json, kName,
                     {"num_train_timesteps", "shift", "use_dynamic_shifting", "base_shift",
                      "max_shift", "base_image_seq_len", "max_image_seq_len", "invert_sigmas",
                      "shift_terminal", "use_karras_sigmas", "use_exponential_sigmas",
                      "use_beta_sigmas", "time_shift_type", "stochastic_sampling"});
  require_false(json, kName, "invert_sigmas", "no pipeline here inverts them");
  require_false(json, kName, "use_karras_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "use_exponential_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "use_beta_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "stochastic_sampling", "it draws noise every step");
  Config c;
  c.exponential_time_shift = get_choice(json, kName, "time_shift_type", "exponential",
                                        {"exponential", "linear"}) == "exponential";
  c.num_train_timesteps = json.get_int("num_train_timesteps", c.num_train_timesteps);
  c.shift = json.get_double("shift", c.shift);
  c.dynamic_shifting = json.get_bool("use_dynamic_shifting", false);
  c.base_image_seq_len = json.get_int("base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = json.get_int("max_image_seq_len", c.max_image_seq_len);
  c.base_shift = json.get_double("base_shift", c.base_shift);
  c.max_shift = json.get_double("max_shift", c.max_shift);
  c.shift_terminal = get_optional_double(json, "shift_terminal");
  // diffusers skips the stretch for shift_terminal 0 (a falsy value).
  if (c.shift_terminal && *c.shift_terminal == 0.0) c.shift_terminal.reset();
  return c;
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(const Config& config)
    : FlowScheduler(config.num_train_timesteps), config_(config) {
  flow_util::check_schedule(kName, config.num_train_timesteps, "shift", config.shift);
  OMNI_CHECK(!config.shift_terminal || *config.shift_terminal < 1.0, kName,
             ": shift_terminal must be < 1, got ", config.shift_terminal.value_or(0.0));
  OMNI_CHECK(!config.dynamic_shifting || config.max_image_seq_len != config.base_image_seq_len,
             kName, ": max_image_seq_len and base_image_seq_len must differ (mu is linear ",
             "between them), both are ", config.base_image_seq_len);
  // diffusers derives the schedule's ends from its float32 training schedule (shifted only
  // without dynamic shifting); the same ATen ops here give the same float32 values.
  const double n = static_cast<double>(config.num_train_timesteps);
  const at::Tensor t = at::tensor({1.0f, static_cast<float>(n)});
  at::Tensor s = t / config.num_train_timesteps;
  if (!config.dynamic_shifting) s = flow_util::shift_sigmas(s, config.shift);
  sigma_min_ = s[0].item<double>();
  sigma_max_ = s[1].item<double>();
}

void FlowMatchEulerScheduler::set_timesteps(int64_t num_inference_steps) {
  OMNI_CHECK(!config_.dynamic_shifting, kName,
             ": use_dynamic_shifting needs mu, the shift of the image's size: call "
             "set_timesteps(num_inference_steps, mu)");
  set_timesteps(num_inference_steps, 0.0);
}

void FlowMatchEulerScheduler::set_timesteps(int64_t num_inference_steps, double mu) {
  flow_util::check_num_steps(kName, num_inference_steps);
  // numpy's float64 linspace between the ends, in timesteps, then back to sigmas.
  const double n = static_cast<double>(config_.num_train_timesteps);
  std::vector<double> s = flow_util::linspace(sigma_max_ * n, sigma_min_ * n, num_inference_steps);
  for (double& v : s) v /= n;
  set_schedule(at::tensor(s, at::kDouble), mu);
}

void FlowMatchEulerScheduler::set_sigmas(const std::vector<double>& sigmas,
                                         std::optional<double> mu) {
  OMNI_CHECK(!sigmas.empty(), kName, ": set_sigmas needs at least one sigma");
  for (size_t i = 0; i < sigmas.size(); ++i) {
    OMNI_CHECK(sigmas[i] > 0 && sigmas[i] <= 1, kName, ": sigmas must be in (0, 1], sigma ", i,
               " is ", sigmas[i]);
  }
  OMNI_CHECK(mu || !config_.dynamic_shifting, kName,
             ": use_dynamic_shifting needs mu, the shift of the image's size");
  // diffusers turns the caller's sigmas into float32 first, and shifts them in float32.
  set_schedule(at::tensor(sigmas, at::kDouble).to(at::kFloat), mu);
}

std::vector<double> FlowMatchEulerScheduler::linear_sigmas(int64_t num_inference_steps) {
  flow_util::check_num_steps(kName, num_inference_steps);
  return flow_util::linspace(1.0, 1.0 / static_cast<double>(num_inference_steps),
                             num_inference_steps);
}

double FlowMatchEulerScheduler::mu_for(int64_t image_seq_len) const {
  // As the pipelines' calculate_shift, operation for operation (Python floats).
  const double m = (config_.max_shift - config_.base_shift) /
                   static_cast<double>(config_.max_image_seq_len - config_.base_image_seq_len);
  const double b = config_.base_shift - m * static_cast<double>(config_.base_image_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

void FlowMatchEulerScheduler::set_schedule(at::Tensor s, std::optional<double> mu) {
  // Each line is numpy's expression in the same order and dtype (a Python float meeting a
  // float32 array is rounded to float32 first), so the roundings are numpy's.
  if (config_.dynamic_shifting) {
    const double m = config_.exponential_time_shift ? std::exp(*mu) : *mu;
    s = m / (m + (1 / s - 1));
  } else {
    s = flow_util::shift_sigmas(s, config_.shift);
  }
  if (config_.shift_terminal) s = flow_util::stretch_to_terminal(s, *config_.shift_terminal);
  const at::Tensor sigmas = s.to(at::kFloat);
  timesteps_ = sigmas * config_.num_train_timesteps;
  sigmas_ = at::cat({sigmas, at::zeros({1}, at::kFloat)});
}

at::Tensor FlowMatchEulerScheduler::step(const at::Tensor& model_output, int64_t step_index,
                                         const at::Tensor& sample) {
  check_step_index(step_index);
  OMNI_CHECK(model_output.sizes() == sample.sizes(), kName, "::step: model_output ",
             model_output.sizes(), " and sample ", sample.sizes(), " differ in shape");
  // As diffusers: the update in float32, the result in the model output's dtype.
  const at::Tensor dt = sigmas_[step_index + 1] - sigmas_[step_index];
  return (sample.to(at::kFloat) + dt * model_output).to(model_output.scalar_type());
}

}  // namespace omni::models
