// diffusers' WanPipeline (Wan2.1 T2V, Wan2.2 T2V-A14B with two experts, Wan2.2 TI2V-5B with
// per-token timesteps) on the parts of this folder: the UMT5 tokenizer and encoder, one or two
// WanTransformer3DModels, AutoencoderKLWan and a flow scheduler, loaded from a diffusers
// pipeline folder. generate() follows pipeline_wan.py step by step (casts, cond before uncond,
// timestep expansion), so a request gives diffusers' frames (tests/fixtures/wan*_pipeline_tiny).
// With an image and expand_timesteps it follows the TI2V-5B image-to-video path of
// pipeline_wan_i2v.py (first latent frame from the image, its tokens at timestep 0).
//
// The pipeline is the offload engine's root module: its children are `text_encoder`,
// `transformer`, `transformer_2` (when the folder has one) and `vae`.
//
// Not supported (rejected with an error naming the file or field): WanImageToVideoPipeline
// folders (Wan2.1 I2V's CLIP image encoder, A14B I2V's 36-channel input), a folder without
// `transformer`, resizing the input image (it must be height x width), batches (one prompt).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/model_spec.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/diffusion/umt5_encoder.h"
#include "model_runner/diffusion/wan_transformer.h"
#include "model_runner/diffusion/wan_vae.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// What generate() passes through, for tests and tracing; each member may be empty. Tensors are
// the pipeline's own (do not modify them).
struct WanTrace {
  // ids / attention_mask [1, L] int64; embeds [1, L, text_dim] after the cut and zero padding.
  std::function<void(bool negative, const at::Tensor& ids, const at::Tensor& mask,
                     const at::Tensor& embeds)>
      prompt;
  std::function<void(const at::Tensor& latents)> initial_latents;
  // One call per transformer forward: its hidden_states, timestep and output.
  std::function<void(int64_t step, bool cond, const at::Tensor& input, const at::Tensor& timestep,
                     const at::Tensor& output)>
      transformer;
  std::function<void(int64_t step, const at::Tensor& latents)> step_latents;
};

struct WanRequest {
  std::string prompt;
  std::string negative_prompt;  // "" as in diffusers when absent
  int64_t height = 480;
  int64_t width = 832;
  int64_t num_frames = 81;  // 4k + 1
  int64_t num_inference_steps = 50;
  double guidance_scale = 5.0;  // > 1 runs classifier-free guidance
  // The low-noise expert's guidance (transformer_2); = guidance_scale when unset.
  std::optional<double> guidance_scale_2;
  std::optional<double> boundary_ratio;  // overrides model_index.json's
  std::optional<double> flow_shift;      // overrides the scheduler's flow_shift / shift
  uint64_t seed = 0;  // torch.Generator("cpu").manual_seed(seed) for the initial noise
  // TI2V image-to-video (expand_timesteps folders only): [height, width, 3], uint8 or float in
  // [0, 1]; undefined for text-to-video.
  at::Tensor image;
  int64_t max_sequence_length = 512;
  const WanTrace* trace = nullptr;
};

struct WanStep {
  int64_t index = 0;
  int64_t total = 0;
  double timestep = 0;
  const char* transformer = "transformer";  // or "transformer_2"
};
// Called after each denoising step; returning false cancels the request.
using WanStepCallback = std::function<bool(const WanStep&)>;

struct WanResult {
  at::Tensor
      frames;  // [num_frames, height, width, 3] float32 in [0, 1], CPU; undefined if cancelled
  bool cancelled = false;
};

// What encode() gives denoise(): the request's text (and TI2V image) conditioning. A stage
// graph (encode / denoise / decode workers) passes these tensors between processes.
struct WanConditioning {
  at::Tensor prompt_embeds;    // [1, L, text_dim] in the text encoder's dtype
  at::Tensor negative_embeds;  // the same for the negative prompt; undefined without CFG
  at::Tensor image_latent;     // TI2V: the image's normalized latent, float32; else undefined
};

// One request's denoising in progress, between steps: WanPipeline::start_denoise makes it,
// denoise_step advances several by a step each in one transformer call, finish_denoise gives
// the final latents. The members are the pipeline's.
struct WanDenoising {
  int64_t index = 0;  // the next step
  int64_t total = 0;
  bool done() const { return index >= total; }
  // The transformer the next step runs: 0 `transformer` (high noise), 1 `transformer_2`.
  int expert() const;

  const WanTrace* trace = nullptr;
  std::shared_ptr<FlowScheduler> scheduler;
  at::Tensor timesteps;                       // [total], the scheduler's
  at::Tensor latents, mask, condition;        // on the device, float32
  at::Tensor prompt_embeds, negative_embeds;  // in the transformer's dtype
  double guidance_scale = 1, guidance_scale_2 = 1;
  std::optional<float> boundary_timestep;
  bool cfg = false;
};

// model_index.json's fields that steer the pipeline.
struct WanPipelineConfig {
  std::optional<double> boundary_ratio;
  bool expand_timesteps = false;
  bool has_transformer_2 = false;
};

class WanPipeline : public torch::nn::Module {
 public:
  // Use load_wan_pipeline; registers the children under the names the offload engine knows.
  WanPipeline(std::string dir, WanPipelineConfig config, Tokenizer tokenizer,
              std::shared_ptr<UMT5Encoder> text_encoder,
              std::shared_ptr<WanTransformer3DModel> transformer,
              std::shared_ptr<WanTransformer3DModel> transformer_2,
              std::shared_ptr<AutoencoderKLWan> vae);

  // Runs the parts' inputs on `device` (where the modules are, or where the offload engine
  // brings them). Throws on an invalid request. It is encode -> denoise -> decode_latents.
  WanResult generate(const WanRequest& request, const WanStepCallback& on_step = {},
                     c10::Device device = c10::kCPU);

  // The three steps of generate(), for stages that run them apart (they do not validate: call
  // validate first). encode reads the text encoder (and the VAE for request.image).
  WanConditioning encode(const WanRequest& request, c10::Device device);
  // The transformers and the scheduler, from the seeded noise: the final latents on `device`
  // (the image latent put back into frame 0 for TI2V); undefined when on_step cancelled.
  at::Tensor denoise(const WanRequest& request, const WanConditioning& conditioning,
                     const WanStepCallback& on_step, c10::Device device);
  // denoise() a step at a time, for a stage that runs several requests' steps together (each
  // request's latents equal its denoise()'s bit for bit). start_denoise draws the noise and
  // sets the schedule; denoise_step runs the next step of every member of `batch` (not done,
  // all on the same expert()) with their passes through each block in one visit, and returns
  // their WanSteps; finish_denoise returns the final latents as denoise does.
  WanDenoising start_denoise(const WanRequest& request, const WanConditioning& conditioning,
                             c10::Device device);
  std::vector<WanStep> denoise_step(const std::vector<WanDenoising*>& batch);
  at::Tensor finish_denoise(const WanDenoising& state) const;
  // The VAE: denormalizes, decodes and post-processes to [F, H, W, 3] float32 in [0, 1] on the
  // CPU.
  at::Tensor decode_latents(const at::Tensor& latents);

  // Throws naming the field when `request` is invalid for this pipeline.
  void validate(const WanRequest& request) const;

  const WanPipelineConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  UMT5Encoder& text_encoder() { return *text_encoder_; }
  WanTransformer3DModel& transformer() { return *transformer_; }
  WanTransformer3DModel* transformer_2() { return transformer_2_.get(); }
  AutoencoderKLWan& vae() { return *vae_; }
  // What the offload engine needs beyond the children's names: each block's phases (attn1,
  // attn2, ffn; norm2 and the modulation table are read by the block itself, so they stay
  // resident under phase granularity instead of forming a phase no call would load).
  offload::ModelSpec offload_spec() const;
  // A fresh scheduler from scheduler/scheduler_config.json, with `flow_shift` when given.
  std::unique_ptr<FlowScheduler> make_scheduler(std::optional<double> flow_shift) const;

 private:
  // diffusers' _get_t5_prompt_embeds for one prompt: [1, L, d_model] in the encoder's dtype.
  at::Tensor encode_prompt(const std::string& prompt, int64_t max_sequence_length, bool negative,
                           const WanTrace* trace, c10::Device device);
  // The TI2V conditioning latent: the image through the VAE, normalized, float32.
  at::Tensor encode_image(const at::Tensor& image, c10::Device device);

  std::string dir_;
  WanPipelineConfig config_;
  Tokenizer tokenizer_;
  std::shared_ptr<UMT5Encoder> text_encoder_;
  std::shared_ptr<WanTransformer3DModel> transformer_, transformer_2_;
  std::shared_ptr<AutoencoderKLWan> vae_;
};

// Loads a diffusers WanPipeline folder: model_index.json, tokenizer/, text_encoder/,
// transformer/, transformer_2/ (when model_index names it), vae/, scheduler/. Compute dtype
// `dtype` for the encoder, transformers and VAE (their float32 parts stay float32). A missing
// part or a config that does not fit the others throws naming the folder, file and field.
std::shared_ptr<WanPipeline> load_wan_pipeline(const std::string& dir, at::ScalarType dtype);

}  // namespace omni::models
