// The flow-matching schedulers of diffusers: FlowMatchEulerDiscreteScheduler (Wan2.1's, and with
// the shift the image's size gives, Qwen-Image's and FLUX's) and UniPCMultistepScheduler with
// flow prediction (Wan2.2's official sampler). Each is built from a diffusers
// scheduler_config.json and gives the timesteps, sigmas and step results diffusers gives
// (tests/fixtures/wan_schedulers). A setting
// outside the flow path is rejected with an error naming the file, the field and its value, so
// a config that would sample differently never loads silently.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace omni::models {

class HfConfig;

// What a denoising loop needs of a scheduler:
//   scheduler.set_timesteps(n);
//   for (int64_t i = 0; i < n; ++i)
//     x = scheduler.step(model(x, scheduler.timesteps()[i]), i, x);
// Schedules live on the CPU; samples and model outputs may be on any device.
class FlowScheduler {
 public:
  virtual ~FlowScheduler() = default;

  // A new schedule of `num_inference_steps` (>= 1) steps; forgets the steps taken so far.
  virtual void set_timesteps(int64_t num_inference_steps) = 0;
  // The sample after step `step_index` from the model's output at that step (velocity, flow
  // prediction) and the sample it was given. Throws before set_timesteps or out of range.
  virtual at::Tensor step(const at::Tensor& model_output, int64_t step_index,
                          const at::Tensor& sample) = 0;
  virtual const char* name() const = 0;

  // [n]: what the model is given at step i; float32 (FlowMatchEuler) or int64 (UniPC), as in
  // diffusers. Undefined before set_timesteps.
  const at::Tensor& timesteps() const { return timesteps_; }
  // [n + 1] float32: step i's noise level, and last the level after the final step.
  const at::Tensor& sigmas() const { return sigmas_; }
  int64_t num_inference_steps() const { return timesteps_.defined() ? timesteps_.size(0) : 0; }
  int64_t num_train_timesteps() const { return num_train_timesteps_; }

  // The flow interpolation at step `step_index`'s noise level: (1 - sigma) * sample + sigma *
  // noise (diffusers' UniPC add_noise and FlowMatchEuler scale_noise), e.g. to start
  // image-to-video from a partly noised latent.
  at::Tensor add_noise(const at::Tensor& sample, const at::Tensor& noise, int64_t step_index) const;

 protected:
  explicit FlowScheduler(int64_t num_train_timesteps);
  // Throws unless set_timesteps ran and 0 <= step_index < n.
  void check_step_index(int64_t step_index) const;

  int64_t num_train_timesteps_;
  at::Tensor timesteps_;
  at::Tensor sigmas_;
};

// diffusers' FlowMatchEulerDiscreteScheduler: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v_i, on
// sigmas shifted by a fixed `shift` (Wan2.1) or, with dynamic shifting, by the `mu` the image's
// size gives (Qwen-Image, FLUX).
class FlowMatchEulerScheduler : public FlowScheduler {
 public:
  struct Config {
    int64_t num_train_timesteps = 1000;
    double shift = 1.0;  // the fixed shift, without dynamic shifting
    // use_dynamic_shifting: the shift is the caller's `mu`, through e^mu / (e^mu + 1/s - 1)
    // (time_shift_type "exponential") or mu / (mu + 1/s - 1) ("linear").
    bool dynamic_shifting = false;
    bool exponential_time_shift = true;
    // What mu_for turns an image's latent sequence length into mu with.
    int64_t base_image_seq_len = 256;
    int64_t max_image_seq_len = 4096;
    double base_shift = 0.5;
    double max_shift = 1.15;
    // Stretches the shifted sigmas so that the last one is this value.
    std::optional<double> shift_terminal;
  };
  explicit FlowMatchEulerScheduler(const Config& config);
  // Reads the fields of a FlowMatchEulerDiscreteScheduler scheduler_config.json.
  static Config parse_config(const HfConfig& json);

  // Evenly spaced training sigmas; with dynamic shifting it throws (the shift needs mu).
  void set_timesteps(int64_t num_inference_steps) override;
  // With dynamic shifting: the same steps shifted by `mu` (without, `mu` is ignored, as in
  // diffusers).
  void set_timesteps(int64_t num_inference_steps, double mu);
  // A schedule of the caller's sigmas (each in (0, 1], rounded to float32 as diffusers does),
  // shifted as set_timesteps shifts; `mu` is needed with dynamic shifting.
  void set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu = std::nullopt);
  // The sigmas the Qwen-Image and FLUX pipelines pass: numpy.linspace(1, 1 / n, n).
  static std::vector<double> linear_sigmas(int64_t num_inference_steps);
  // diffusers' calculate_shift with this config's values, as those pipelines call it: the mu of
  // an image of `image_seq_len` latent tokens (linear between base and max).
  double mu_for(int64_t image_seq_len) const;
  at::Tensor step(const at::Tensor& model_output, int64_t step_index,
                  const at::Tensor& sample) override;
  const char* name() const override { return "FlowMatchEulerDiscreteScheduler"; }
  const Config& config() const { return config_; }

 private:
  // Shifts `sigmas` (float64 or float32: diffusers computes in the dtype they have), stretches
  // them to shift_terminal, and makes them the schedule.
  void set_schedule(at::Tensor sigmas, std::optional<double> mu);

  Config config_;
  // The ends of the training schedule (shifted unless dynamic), where set_timesteps spaces its
  // steps.
  double sigma_max_ = 1.0;
  double sigma_min_ = 0.0;
};

// diffusers' UniPCMultistepScheduler with prediction_type "flow_prediction" and
// use_flow_sigmas: the UniPC predictor-corrector in data prediction (predict_x0), on the
// shifted flow sigmas. Keeps the last `solver_order` data predictions between steps, so steps
// run in order after set_timesteps.
class UniPCMultistepScheduler : public FlowScheduler {
 public:
  struct Config {
    int64_t num_train_timesteps = 1000;
    double flow_shift = 1.0;
    int64_t solver_order = 2;  // 1..3
    bool solver_bh2 = true;    // solver_type "bh2": B(h) = expm1(h); "bh1": B(h) = h
    bool lower_order_final = true;
    std::vector<int64_t> disable_corrector;  // step indices whose corrector is skipped
    bool final_sigma_zero = true;            // final_sigmas_type "zero", else "sigma_min"
    std::optional<double> shift_terminal;
  };
  explicit UniPCMultistepScheduler(const Config& config);
  // Reads the fields of a UniPCMultistepScheduler scheduler_config.json.
  static Config parse_config(const HfConfig& json);

  void set_timesteps(int64_t num_inference_steps) override;
  // `step_index` must be the next step: 0 after set_timesteps, then 1, 2, ...
  at::Tensor step(const at::Tensor& model_output, int64_t step_index,
                  const at::Tensor& sample) override;
  const char* name() const override { return "UniPCMultistepScheduler"; }
  const Config& config() const { return config_; }

 private:
  // UniP (predictor) from step `step_index_` to the next, and UniC (corrector): this step's
  // sample again from `last_sample`, now with the data prediction `this_x0` made at this step.
  // `model_outputs_` holds the earlier data predictions they combine.
  at::Tensor predict(const at::Tensor& sample, int64_t order) const;
  at::Tensor correct(const at::Tensor& this_x0, const at::Tensor& last_sample, int64_t order) const;
  // The UniPC update from sigma index `s0` to `t` of order `order`, with `history` the data
  // predictions at s0, s0 - 1, ... (newest first); `this_x0` set makes it the corrector.
  at::Tensor update(int64_t t, int64_t s0, const at::Tensor& x, int64_t order,
                    const std::vector<at::Tensor>& history, const at::Tensor& this_x0) const;

  Config config_;
  std::vector<at::Tensor> model_outputs_;  // data predictions, oldest first, <= solver_order
  at::Tensor last_sample_;                 // the sample the last predictor started from
  int64_t lower_order_nums_ = 0;
  int64_t this_order_ = 0;
  int64_t step_index_ = 0;  // the step step() expects next
};

// The scheduler a diffusers scheduler_config.json describes ("_class_name"); `path` is the file
// or the folder holding it (a pipeline's scheduler/).
std::unique_ptr<FlowScheduler> load_flow_scheduler(const std::string& path);

}  // namespace omni::models
