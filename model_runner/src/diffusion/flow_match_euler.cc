// diffusers' FlowMatchEulerDiscreteScheduler (0.42), the static-shift path Wan2.1 uses.
#include <ATen/ATen.h>

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
  // base_shift, max_shift, *_image_seq_len and time_shift_type only matter with dynamic
  // shifting, which is rejected; time_shift_type is still checked as diffusers checks it.
  require_false(json, kName, "use_dynamic_shifting",
                "it needs the resolution-dependent mu; Wan uses a fixed shift");
  require_false(json, kName, "invert_sigmas", "not a Wan setting");
  require_false(json, kName, "use_karras_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "use_exponential_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "use_beta_sigmas", "only the shifted linear sigmas are");
  require_false(json, kName, "stochastic_sampling", "it draws noise every step");
  get_choice(json, kName, "time_shift_type", "exponential", {"exponential", "linear"});
  Config c;
  c.num_train_timesteps = json.get_int("num_train_timesteps", c.num_train_timesteps);
  c.shift = json.get_double("shift", c.shift);
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
  // diffusers derives the schedule's ends from its float32 training schedule; the same ATen
  // ops here give the same float32 values.
  const double n = static_cast<double>(config.num_train_timesteps);
  const at::Tensor t = at::tensor({1.0f, static_cast<float>(n)});
  at::Tensor s = t / config.num_train_timesteps;
  s = config.shift * s / (1 + (config.shift - 1) * s);
  sigma_min_ = s[0].item<double>();
  sigma_max_ = s[1].item<double>();
}

void FlowMatchEulerScheduler::set_timesteps(int64_t num_inference_steps) {
  flow_util::check_num_steps(kName, num_inference_steps);
  const double n = static_cast<double>(config_.num_train_timesteps);
  std::vector<double> s = flow_util::linspace(sigma_max_ * n, sigma_min_ * n, num_inference_steps);
  for (double& v : s) v /= n;
  flow_util::shift_sigmas(s, config_.shift);
  if (config_.shift_terminal) flow_util::stretch_to_terminal(s, *config_.shift_terminal);
  const at::Tensor sigmas = at::tensor(s, at::kDouble).to(at::kFloat);
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
