// diffusers' QwenImagePipeline (Qwen-Image text-to-image), QwenImageEditPipeline and
// QwenImageEditPlusPipeline on the parts of this folder: the Qwen2 tokenizer and the Qwen2.5-VL
// text encoder (its last hidden state, the template's first tokens dropped; for edits with the
// condition images through its vision tower), QwenImageTransformer2DModel,
// AutoencoderKLQwenImage (the Wan VAE, one frame; edits encode their images with it) and the
// FlowMatchEuler scheduler with dynamic shifting. generate() follows pipeline_qwenimage*.py step
// by step (casts, cond before uncond, true CFG with its norm rescale), so a request gives
// diffusers' images (tests/fixtures/qwen_image_pipeline_tiny, qwen_image_edit_pipeline_tiny).
//
// The pipeline is the offload engine's root module: its children are `text_encoder`, `visual`
// (the text encoder's vision tower; edit folders only), `transformer` and `vae`.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/model_spec.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/diffusion/qwen_image_edit_inputs.h"
#include "model_runner/diffusion/qwen_image_edit_prompt.h"
#include "model_runner/diffusion/qwen_image_prompt.h"
#include "model_runner/diffusion/qwen_image_transformer.h"
#include "model_runner/diffusion/wan_vae.h"
#include "model_runner/qwen2_5/decoder.h"

namespace omni::models {

// What generate() passes through, for tests and tracing; each member may be empty. Tensors are
// the pipeline's own (do not modify them).
struct QwenImageTrace {
  std::function<void(bool negative, const QwenImagePromptEmbeds& prompt)> prompt;
  std::function<void(const at::Tensor& latents)> initial_latents;  // packed [N, L, 64]
  // One call per transformer forward: its timestep (t / 1000) and output (for an edit the
  // generated image's rows, as the pipeline cuts it).
  std::function<void(int64_t step, bool cond, const at::Tensor& timestep, const at::Tensor& output)>
      transformer;
  std::function<void(int64_t step, const at::Tensor& latents)> step_latents;
};

// QwenImagePipeline's default height and width (default_sample_size x the VAE's 8).
inline constexpr int64_t kQwenImageDefaultSize = 1024;

struct QwenImageRequest {
  std::string prompt;
  // Guidance runs only with a negative prompt and true_cfg_scale > 1, as in diffusers.
  std::optional<std::string> negative_prompt;
  // Multiples of 16 (the VAE's 8 x the 2 x 2 packing); 0 = the pipeline's default:
  // kQwenImageDefaultSize, or for an edit the size its (last) image takes at an area of 1024^2.
  int64_t height = 0;
  int64_t width = 0;
  // The images to edit: QwenImageEditPipeline takes one, QwenImageEditPlusPipeline one or more,
  // QwenImagePipeline none.
  std::vector<RgbImage> images;
  int64_t num_inference_steps = 50;
  double true_cfg_scale = 4.0;
  int64_t num_images = 1;  // num_images_per_prompt
  uint64_t seed = 0;       // torch.Generator("cpu").manual_seed(seed) for the initial noise
  int64_t max_sequence_length = 512;
  const QwenImageTrace* trace = nullptr;

  bool true_cfg() const { return negative_prompt.has_value() && true_cfg_scale > 1.0; }
};

struct QwenImageStep {
  int64_t index = 0;
  int64_t total = 0;
  double timestep = 0;
};
// Called after each denoising step; returning false cancels the request.
using QwenImageStepCallback = std::function<bool(const QwenImageStep&)>;

struct QwenImageResult {
  at::Tensor images;  // [N, height, width, 3] float32 in [0, 1], CPU; undefined if cancelled
  bool cancelled = false;
};

// What encode() gives denoise(): the prompt's (and the negative prompt's) embeddings, and for an
// edit its images' latents.
struct QwenImageConditioning {
  QwenImagePromptEmbeds prompt;
  QwenImagePromptEmbeds negative;  // undefined embeds without true CFG
  // Edits: the images' normalized, packed latents one after the other [1, sum L_i, 64], and
  // each image's latent grid (appended to the sequence after the generated image's).
  at::Tensor image_latents;
  std::vector<QwenImageShape> image_shapes;
};

class QwenImagePipeline : public torch::nn::Module {
 public:
  // Use load_qwen_image_pipeline; registers the children under the names the offload engine
  // knows, in diffusers' offload order (text_encoder -> transformer -> vae). `vision` (its tower
  // becomes the child `visual`) for the edit variants only.
  QwenImagePipeline(std::string dir, QwenImageVariant variant, QwenImageTokenizer tokenizer,
                    std::shared_ptr<qwen2_5::TextDecoder> text_encoder,
                    std::shared_ptr<qwen2_5::VisionTower> visual, QwenImageVisionEncoder vision,
                    std::shared_ptr<QwenImageTransformer2DModel> transformer,
                    std::shared_ptr<AutoencoderKLWan> vae);

  // Runs the parts' inputs on `device` (where the modules are, or where the offload engine
  // brings them). Throws on an invalid request. It is encode -> denoise -> decode_latents.
  QwenImageResult generate(const QwenImageRequest& request,
                           const QwenImageStepCallback& on_step = {},
                           c10::Device device = c10::kCPU);

  // The three steps of generate(), for stages that run them apart (they do not validate).
  QwenImageConditioning encode(const QwenImageRequest& request, c10::Device device);
  // The transformer and the scheduler from the seeded noise: the final packed latents
  // [N, L, 64] on `device`; undefined when on_step cancelled.
  at::Tensor denoise(const QwenImageRequest& request, const QwenImageConditioning& conditioning,
                     const QwenImageStepCallback& on_step, c10::Device device);
  // Unpacks, denormalizes, decodes and post-processes to [N, H, W, 3] float32 in [0, 1] on the
  // CPU (diffusers' output_type="np").
  at::Tensor decode_latents(const at::Tensor& latents, int64_t height, int64_t width);

  // Throws naming the field when `request` is invalid for this pipeline.
  void validate(const QwenImageRequest& request) const;
  // The request's {height, width}, its defaults resolved.
  std::pair<int64_t, int64_t> output_size(const QwenImageRequest& request) const;
  QwenImageVariant variant() const { return variant_; }

  const QwenImageTokenizer& tokenizer() const { return tokenizer_; }
  qwen2_5::TextDecoder& text_encoder() { return *text_encoder_; }
  // The vision tower, its image tokens and the processor's options (tower null: text-to-image).
  const QwenImageVisionEncoder& vision() const { return vision_; }
  QwenImageTransformer2DModel& transformer() { return *transformer_; }
  AutoencoderKLWan& vae() { return *vae_; }
  // The children's roles and the transformer's block list with its phases.
  offload::ModelSpec offload_spec() const;
  // A fresh scheduler from scheduler/scheduler_config.json.
  std::unique_ptr<FlowMatchEulerScheduler> make_scheduler() const;

 private:
  std::string dir_;
  QwenImageVariant variant_;
  QwenImageTokenizer tokenizer_;
  std::shared_ptr<qwen2_5::TextDecoder> text_encoder_;
  std::shared_ptr<qwen2_5::VisionTower> visual_;  // edits only
  QwenImageVisionEncoder vision_;
  std::shared_ptr<QwenImageTransformer2DModel> transformer_;
  std::shared_ptr<AutoencoderKLWan> vae_;
};

// Loads a diffusers QwenImagePipeline, QwenImageEditPipeline or QwenImageEditPlusPipeline folder:
// model_index.json, tokenizer/, text_encoder/, transformer/, vae/, scheduler/, and for edits
// processor/ (its preprocessor_config.json). Compute dtype `dtype` for every part. A missing
// part or a config that does not fit the others throws naming the folder, file and field.
std::shared_ptr<QwenImagePipeline> load_qwen_image_pipeline(const std::string& dir,
                                                            at::ScalarType dtype);

}  // namespace omni::models
