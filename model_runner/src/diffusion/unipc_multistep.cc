// diffusers' UniPCMultistepScheduler (0.42) on its flow-matching path (prediction_type
// "flow_prediction", use_flow_sigmas), Wan2.2's official sampler. The scalar coefficients are
// 0-dim float32 tensors on the CPU, computed with the ops diffusers uses, so that they round
// as diffusers' do.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "flow_scheduler_util.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

constexpr const char* kName = "UniPCMultistepScheduler";

// Flow sigmas: alpha = 1 - sigma, and lambda = log(alpha) - log(sigma), the log-SNR that UniPC
// steps in.
at::Tensor lambda_of(const at::Tensor& sigma) { return at::log(1 - sigma) - at::log(sigma); }

}  // namespace

UniPCMultistepScheduler::Config UniPCMultistepScheduler::parse_config(const HfConfig& json) {
  using namespace flow_util;
  check_class_name(json, kName);
  check_known_fields(json, kName,
                     {"num_train_timesteps",
                      "beta_start",
                      "beta_end",
                      "beta_schedule",
                      "trained_betas",
                      "solver_order",
                      "prediction_type",
                      "thresholding",
                      "dynamic_thresholding_ratio",
                      "sample_max_value",
                      "predict_x0",
                      "solver_type",
                      "lower_order_final",
                      "disable_corrector",
                      "solver_p",
                      "use_karras_sigmas",
                      "use_exponential_sigmas",
                      "use_beta_sigmas",
                      "use_flow_sigmas",
                      "flow_shift",
                      "timestep_spacing",
                      "steps_offset",
                      "final_sigmas_type",
                      "rescale_betas_zero_snr",
                      "use_dynamic_shifting",
                      "time_shift_type",
                      "sigma_min",
                      "sigma_max",
                      "shift_terminal"});
  // The beta schedule (beta_*, trained_betas, rescale_betas_zero_snr), timestep_spacing,
  // steps_offset and sigma_min / sigma_max (Karras and friends) do not enter the flow path:
  // use_flow_sigmas replaces the sigmas and timesteps they would give.
  get_choice(json, kName, "prediction_type", "epsilon", {"flow_prediction"});
  OMNI_CHECK(json.get_bool("use_flow_sigmas", false), json.source(),
             ": field 'use_flow_sigmas' must be true (only the flow-matching path is supported)");
  OMNI_CHECK(json.get_bool("predict_x0", true), json.source(),
             ": field 'predict_x0' = false is not supported (flow prediction is converted to a "
             "data prediction, as diffusers requires)");
  require_false(json, kName, "thresholding", "dynamic thresholding is for pixel-space models");
  require_false(json, kName, "use_dynamic_shifting",
                "it needs the resolution-dependent mu; Wan uses a fixed flow_shift");
  require_false(json, kName, "use_karras_sigmas", "only the shifted flow sigmas are");
  require_false(json, kName, "use_exponential_sigmas", "only the shifted flow sigmas are");
  require_false(json, kName, "use_beta_sigmas", "only the shifted flow sigmas are");
  require_null(json, kName, "solver_p", "an external predictor scheduler");
  OMNI_CHECK(json.get_bool("lower_order_final", true), json.source(),
             ": field 'lower_order_final' = false is not supported (with flow sigmas the last "
             "step of order > 1 divides by an infinite log-SNR step)");
  Config c;
  c.num_train_timesteps = json.get_int("num_train_timesteps", c.num_train_timesteps);
  c.flow_shift = json.get_double("flow_shift", c.flow_shift);
  c.solver_order = json.get_int("solver_order", c.solver_order);
  OMNI_CHECK(c.solver_order >= 1 && c.solver_order <= 3, json.source(),
             ": field 'solver_order' = ", c.solver_order, " is not supported; supported: 1, 2, 3");
  // diffusers maps the DPM-Solver names midpoint / heun / logrho to bh2.
  const std::string solver =
      get_choice(json, kName, "solver_type", "bh2", {"bh1", "bh2", "midpoint", "heun", "logrho"});
  c.solver_bh2 = solver != "bh1";
  c.disable_corrector = json.get_int_list("disable_corrector", std::vector<int64_t>{});
  c.final_sigma_zero =
      get_choice(json, kName, "final_sigmas_type", "zero", {"zero", "sigma_min"}) == "zero";
  c.shift_terminal = get_optional_double(json, "shift_terminal");
  // diffusers skips the stretch for shift_terminal 0 (a falsy value).
  if (c.shift_terminal && *c.shift_terminal == 0.0) c.shift_terminal.reset();
  return c;
}

UniPCMultistepScheduler::UniPCMultistepScheduler(const Config& config)
    : FlowScheduler(config.num_train_timesteps), config_(config) {
  flow_util::check_schedule(kName, config.num_train_timesteps, "flow_shift", config.flow_shift);
  OMNI_CHECK(config.solver_order >= 1 && config.solver_order <= 3, kName,
             ": solver_order must be 1, 2 or 3, got ", config.solver_order);
  OMNI_CHECK(!config.shift_terminal || *config.shift_terminal < 1.0, kName,
             ": shift_terminal must be < 1, got ", config.shift_terminal.value_or(0.0));
}

void UniPCMultistepScheduler::set_timesteps(int64_t num_inference_steps) {
  flow_util::check_num_steps(kName, num_inference_steps);
  const double n = static_cast<double>(config_.num_train_timesteps);
  std::vector<double> s = flow_util::linspace(1.0, 1.0 / n, num_inference_steps + 1);
  s.pop_back();
  at::Tensor shifted = flow_util::shift_sigmas(at::tensor(s, at::kDouble), config_.flow_shift);
  if (config_.shift_terminal) {
    shifted = flow_util::stretch_to_terminal(shifted, *config_.shift_terminal);
  }
  s.assign(shifted.data_ptr<double>(), shifted.data_ptr<double>() + shifted.numel());
  // sigma 1 would make log(alpha) = -inf in the first step.
  constexpr double kEps = 1e-6;
  if (std::fabs(s[0] - 1.0) < kEps) s[0] -= kEps;
  std::vector<int64_t> t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = static_cast<int64_t>(s[i] * n);  // truncates
  s.push_back(config_.final_sigma_zero ? 0.0 : s.back());
  timesteps_ = at::tensor(t, at::kLong);
  sigmas_ = at::tensor(s, at::kDouble).to(at::kFloat);
  model_outputs_.clear();
  last_sample_ = at::Tensor();
  lower_order_nums_ = 0;
  this_order_ = 0;
  step_index_ = 0;
}

at::Tensor UniPCMultistepScheduler::step(const at::Tensor& model_output, int64_t step_index,
                                         const at::Tensor& sample) {
  check_step_index(step_index);
  OMNI_CHECK(step_index == step_index_, kName, "::step: step_index must be ", step_index_,
             " (steps run in order after set_timesteps), got ", step_index);
  OMNI_CHECK(model_output.sizes() == sample.sizes(), kName, "::step: model_output ",
             model_output.sizes(), " and sample ", sample.sizes(), " differ in shape");
  // Flow prediction v = noise - x0, so the data prediction is x - sigma * v.
  const at::Tensor x0 = sample - sigmas_[step_index] * model_output;

  // UniC: refine this sample with the data prediction the model just made at it.
  const bool corrector_off =
      std::find(config_.disable_corrector.begin(), config_.disable_corrector.end(),
                step_index - 1) != config_.disable_corrector.end();
  at::Tensor x = sample;
  if (step_index > 0 && !corrector_off && last_sample_.defined()) {
    x = correct(x0, last_sample_, this_order_);
  }

  if (static_cast<int64_t>(model_outputs_.size()) == config_.solver_order) {
    model_outputs_.erase(model_outputs_.begin());
  }
  model_outputs_.push_back(x0);
  // Lower orders while the history fills up and, with lower_order_final, at the end.
  int64_t order = config_.solver_order;
  if (config_.lower_order_final) order = std::min(order, num_inference_steps() - step_index);
  this_order_ = std::min(order, lower_order_nums_ + 1);
  last_sample_ = x;

  at::Tensor prev = predict(x, this_order_);
  lower_order_nums_ = std::min(lower_order_nums_ + 1, config_.solver_order);
  ++step_index_;
  return prev;
}

at::Tensor UniPCMultistepScheduler::predict(const at::Tensor& sample, int64_t order) const {
  const std::vector<at::Tensor> history(model_outputs_.rbegin(), model_outputs_.rend());
  return update(step_index_ + 1, step_index_, sample, order, history, at::Tensor());
}

at::Tensor UniPCMultistepScheduler::correct(const at::Tensor& this_x0,
                                            const at::Tensor& last_sample, int64_t order) const {
  // The history does not hold this_x0 yet: its newest entry is the previous step's.
  const std::vector<at::Tensor> history(model_outputs_.rbegin(), model_outputs_.rend());
  return update(step_index_, step_index_ - 1, last_sample, order, history, this_x0);
}

at::Tensor UniPCMultistepScheduler::update(int64_t t, int64_t s0, const at::Tensor& x,
                                           int64_t order, const std::vector<at::Tensor>& history,
                                           const at::Tensor& this_x0) const {
  const bool corrector = this_x0.defined();
  const at::Tensor sigma_t = sigmas_[t];
  const at::Tensor sigma_s0 = sigmas_[s0];
  const at::Tensor alpha_t = 1 - sigma_t;
  const at::Tensor h = lambda_of(sigma_t) - lambda_of(sigma_s0);
  const at::Tensor& m0 = history[0];

  // Ratios of the earlier log-SNR steps to this one, and the divided differences of the data
  // predictions along them.
  std::vector<at::Tensor> rks;
  std::vector<at::Tensor> d1s;
  for (int64_t i = 1; i < order; ++i) {
    const at::Tensor rk = (lambda_of(sigmas_[s0 - i]) - lambda_of(sigma_s0)) / h;
    rks.push_back(rk);
    d1s.push_back((history[i] - m0) / rk);
  }
  rks.push_back(at::ones({}, at::kFloat));
  const at::Tensor rk_all = at::stack(rks);

  // The B(h)-scaled phi functions of -h (data prediction) and the order conditions R rho = b.
  const at::Tensor hh = -h;
  const at::Tensor h_phi_1 = at::expm1(hh);
  const at::Tensor b_h = config_.solver_bh2 ? at::expm1(hh) : hh;
  at::Tensor h_phi_k = h_phi_1 / hh - 1;
  int64_t factorial = 1;
  std::vector<at::Tensor> r_rows;
  std::vector<at::Tensor> b_entries;
  for (int64_t i = 1; i <= order; ++i) {
    r_rows.push_back(at::pow(rk_all, i - 1));
    b_entries.push_back(h_phi_k * factorial / b_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  const at::Tensor r = at::stack(r_rows);
  const at::Tensor b = at::stack(b_entries);

  const at::Tensor first_order = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0;
  // sum_k rho_k * D1_k over the differences (rho of shape [K], each D1 shaped like x). rho is
  // not 0-dim, so it moves to x's device.
  auto weighted = [&](const at::Tensor& rhos) {
    return at::einsum("k,k...->...", {rhos.to(x.device(), x.scalar_type()), at::stack(d1s)});
  };
  at::Tensor x_t;
  if (!corrector) {
    if (d1s.empty()) {
      x_t = first_order;
    } else {
      const at::Tensor rhos_p =
          order == 2 ? at::full({1}, 0.5, x.scalar_type())
                     : at::linalg_solve(r.slice(0, 0, -1).slice(1, 0, -1), b.slice(0, 0, -1));
      x_t = first_order - alpha_t * b_h * weighted(rhos_p);
    }
  } else {
    const at::Tensor rhos_c = order == 1 ? at::full({1}, 0.5, x.scalar_type())
                                         : at::linalg_solve(r, b).to(x.scalar_type());
    const at::Tensor d1_t = this_x0 - m0;
    const at::Tensor last = rhos_c[-1] * d1_t;
    const at::Tensor res = d1s.empty() ? last : weighted(rhos_c.slice(0, 0, -1)) + last;
    x_t = first_order - alpha_t * b_h * res;
  }
  return x_t.to(x.scalar_type());
}

}  // namespace omni::models
