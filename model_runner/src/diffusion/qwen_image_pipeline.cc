// QwenImagePipeline::generate: diffusers' pipeline_qwenimage.py __call__, line for line where
// the numbers depend on it.
#include "model_runner/diffusion/qwen_image_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <vector>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

// The VAE's 8 times the transformer's 2 x 2 packing.
constexpr int64_t kPixelsPerPatch = 16;

// _pack_latents: [N, C, h, w] -> [N, (h / 2) (w / 2), 4 C].
at::Tensor pack(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  return x.view({n, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({n, (h / 2) * (w / 2), c * 4});
}

// _unpack_latents: [N, (h / 2) (w / 2), 4 C] -> [N, C, 1, h, w].
at::Tensor unpack(const at::Tensor& x, int64_t h, int64_t w) {
  const int64_t n = x.size(0), c = x.size(2) / 4;
  return x.view({n, h / 2, w / 2, c, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({n, c, 1, h, w});
}

}  // namespace

void QwenImagePipeline::validate(const QwenImageRequest& r) const {
  OMNI_CHECK(r.height == 0 || (r.height > 0 && r.height % kPixelsPerPatch == 0),
             "QwenImageRequest.height must be a positive multiple of ", kPixelsPerPatch,
             " (or 0 for the default), got ", r.height);
  OMNI_CHECK(r.width == 0 || (r.width > 0 && r.width % kPixelsPerPatch == 0),
             "QwenImageRequest.width must be a positive multiple of ", kPixelsPerPatch,
             " (or 0 for the default), got ", r.width);
  OMNI_CHECK(r.num_inference_steps >= 1, "QwenImageRequest.num_inference_steps must be >= 1, got ",
             r.num_inference_steps);
  OMNI_CHECK(r.num_images >= 1, "QwenImageRequest.num_images must be >= 1, got ", r.num_images);
  // diffusers' check_inputs: the tokenizer's window is 1024 tokens.
  OMNI_CHECK(r.max_sequence_length >= 1 && r.max_sequence_length <= 1024,
             "QwenImageRequest.max_sequence_length must be in [1, 1024], got ",
             r.max_sequence_length);
  switch (variant_) {
    case QwenImageVariant::kTextToImage:
      OMNI_CHECK(r.images.empty(), dir_, " is a text-to-image QwenImagePipeline: it takes no ",
                 "image (", r.images.size(), " given); edits need a QwenImageEdit folder");
      break;
    case QwenImageVariant::kEdit:
      OMNI_CHECK(r.images.size() == 1, dir_, " is a QwenImageEditPipeline: it edits one image, ",
                 r.images.size(), " given");
      break;
    case QwenImageVariant::kEditPlus:
      OMNI_CHECK(!r.images.empty(), dir_, " is a QwenImageEditPlusPipeline: it needs an image ",
                 "to edit");
      break;
  }
  for (size_t i = 0; i < r.images.size(); ++i) {
    const auto& image = r.images[i];
    OMNI_CHECK(image.height > 0 && image.width > 0 &&
                   image.pixels.size() == static_cast<size_t>(image.height * image.width * 3),
               "QwenImageRequest.images[", i, "] is not an RGB image of ", image.width, "x",
               image.height);
  }
}

std::pair<int64_t, int64_t> QwenImagePipeline::output_size(const QwenImageRequest& r) const {
  if (r.images.empty()) {
    return {r.height ? r.height : kQwenImageDefaultSize, r.width ? r.width : kQwenImageDefaultSize};
  }
  // Edit sizes by its (only) image, Edit-Plus by its last.
  const RgbImage& image = r.images.back();
  const auto [w, h] = qwen_image_calculate_dimensions(
      1024.0 * 1024.0, static_cast<double>(image.width) / static_cast<double>(image.height));
  return {r.height ? r.height : h, r.width ? r.width : w};
}

QwenImageResult QwenImagePipeline::generate(const QwenImageRequest& r,
                                            const QwenImageStepCallback& on_step,
                                            c10::Device device) {
  validate(r);
  c10::InferenceMode guard;
  const auto conditioning = encode(r, device);
  const auto latents = denoise(r, conditioning, on_step, device);
  if (!latents.defined()) return QwenImageResult{at::Tensor(), true};
  const auto [height, width] = output_size(r);
  return QwenImageResult{decode_latents(latents, height, width), false};
}

QwenImageConditioning QwenImagePipeline::encode(const QwenImageRequest& r, c10::Device device) {
  c10::InferenceMode guard;
  QwenImageConditioning c;
  QwenImageEditImages images;
  QwenImageEditVision vision;
  if (variant_ != QwenImageVariant::kTextToImage) {
    images = prepare_qwen_image_edit_images(variant_, r.images);
    // The vision tower runs once for the prompt and the negative prompt (diffusers runs it for
    // each: the same embeddings).
    vision = encode_qwen_image_edit_images(vision_, images.condition, device);
  }
  const auto encode_prompt = [&](const std::string& prompt) {
    if (variant_ == QwenImageVariant::kTextToImage) {
      return encode_qwen_image_prompts(tokenizer_, *text_encoder_, {prompt}, r.max_sequence_length,
                                       device);
    }
    return encode_qwen_image_edit_prompt(tokenizer_, *text_encoder_, vision_, variant_, prompt,
                                         vision, device);
  };
  c.prompt = encode_prompt(r.prompt);
  if (r.trace && r.trace->prompt) r.trace->prompt(false, c.prompt);
  if (r.true_cfg()) {
    c.negative = encode_prompt(*r.negative_prompt);
    if (r.trace && r.trace->prompt) r.trace->prompt(true, c.negative);
  }
  // prepare_latents' image part: the VAE's mode, (z - mean) / std, packed, image after image.
  std::vector<at::Tensor> latents;
  const auto dtype = vae_->parameters().front().scalar_type();
  for (const auto& image : images.vae) {
    const auto pixels = qwen_image_vae_pixels(image).to(device, dtype);
    const auto z =
        vae_->normalize_latents(vae_->encode(pixels).mode(), AutoencoderKLWan::StdScaling::kDivide);
    latents.push_back(pack(z.select(2, 0)));
    c.image_shapes.push_back({1, z.size(3) / 2, z.size(4) / 2});
  }
  if (!latents.empty()) c.image_latents = at::cat(latents, 1);
  return c;
}

at::Tensor QwenImagePipeline::denoise(const QwenImageRequest& r,
                                      const QwenImageConditioning& conditioning,
                                      const QwenImageStepCallback& on_step, c10::Device device) {
  c10::InferenceMode guard;
  const QwenImageTrace* trace = r.trace;
  const bool cfg = r.true_cfg();
  OMNI_CHECK(conditioning.prompt.embeds.defined(), "QwenImageConditioning.prompt is missing");
  OMNI_CHECK(!cfg || conditioning.negative.embeds.defined(),
             "QwenImageConditioning.negative is missing: true_cfg_scale ", r.true_cfg_scale,
             " with a negative prompt runs classifier-free guidance");
  OMNI_CHECK(conditioning.image_latents.defined() == (variant_ != QwenImageVariant::kTextToImage),
             "QwenImageConditioning.image_latents must be given exactly for an edit");
  const auto on_device = [&](QwenImagePromptEmbeds e) {
    e.embeds = e.embeds.to(device);
    if (e.mask.defined()) e.mask = e.mask.to(device);
    return repeat_qwen_image_prompt_embeds(std::move(e), r.num_images);
  };
  const auto prompt = on_device(conditioning.prompt);
  QwenImagePromptEmbeds negative;
  if (cfg) negative = on_device(conditioning.negative);

  // prepare_latents: randn_tensor with a CPU generator draws on the CPU in the prompt
  // embeddings' dtype, [N, 1, C, h, w], then packs.
  const auto [height, width] = output_size(r);
  const int64_t h = height / kPixelsPerPatch * 2, w = width / kPixelsPerPatch * 2;
  const int64_t channels = transformer_->config().in_channels / 4;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(r.seed);
  auto latents = at::randn({r.num_images, 1, channels, h, w}, generator,
                           at::TensorOptions().dtype(prompt.embeds.scalar_type()));
  latents = pack(latents.select(1, 0)).to(device);
  if (trace && trace->initial_latents) trace->initial_latents(latents);
  std::vector<QwenImageShape> shapes = {{1, h / 2, w / 2}};
  // An edit's image latents follow the generated ones in the sequence, the same for every
  // image of the batch; the outputs' rows past the generated image are dropped.
  at::Tensor image_latents;
  if (conditioning.image_latents.defined()) {
    image_latents =
        conditioning.image_latents.to(device, latents.scalar_type()).expand({r.num_images, -1, -1});
    shapes.insert(shapes.end(), conditioning.image_shapes.begin(), conditioning.image_shapes.end());
  }
  const int64_t generated = latents.size(1);
  // Both guidance passes in one call (each block visited once a step for both); an edit's
  // outputs cut to the generated image's rows.
  std::vector<QwenImageText> texts = {{prompt.embeds, prompt.mask}};
  if (cfg) texts.push_back({negative.embeds, negative.mask});
  const auto predict = [&](const at::Tensor& timestep) {
    const auto input = image_latents.defined() ? at::cat({latents, image_latents}, 1) : latents;
    auto preds = transformer_->forward_passes(input, texts, timestep, shapes);
    if (image_latents.defined()) {
      for (auto& p : preds) p = p.narrow(1, 0, generated);
    }
    return preds;
  };

  auto scheduler = make_scheduler();
  scheduler->set_sigmas(FlowMatchEulerScheduler::linear_sigmas(r.num_inference_steps),
                        scheduler->mu_for(latents.size(1)));
  const auto timesteps = scheduler->timesteps();
  const int64_t total = timesteps.size(0);
  for (int64_t i = 0; i < total; ++i) {
    const auto timestep =
        timesteps[i].to(device).expand({latents.size(0)}).to(latents.scalar_type()) / 1000;
    const auto preds = predict(timestep);
    auto noise_pred = preds[0];
    if (trace && trace->transformer) trace->transformer(i, true, timestep, noise_pred);
    if (cfg) {
      const auto& neg_pred = preds[1];
      if (trace && trace->transformer) trace->transformer(i, false, timestep, neg_pred);
      // True CFG, then each token's prediction rescaled to the conditional one's norm.
      const auto combined = neg_pred + r.true_cfg_scale * (noise_pred - neg_pred);
      const auto cond_norm = at::linalg_vector_norm(noise_pred, 2, {-1}, true);
      const auto combined_norm = at::linalg_vector_norm(combined, 2, {-1}, true);
      noise_pred = combined * (cond_norm / combined_norm);
    }
    latents = scheduler->step(noise_pred, i, latents);
    if (trace && trace->step_latents) trace->step_latents(i, latents);
    if (on_step) {
      const QwenImageStep step{i, total, timesteps[i].to(at::kDouble).item<double>()};
      if (!on_step(step)) return at::Tensor();
    }
  }
  return latents;
}

at::Tensor QwenImagePipeline::decode_latents(const at::Tensor& latents, int64_t height,
                                             int64_t width) {
  c10::InferenceMode guard;
  const int64_t h = height / kPixelsPerPatch * 2, w = width / kPixelsPerPatch * 2;
  const auto dtype = vae_->parameters().front().scalar_type();
  const auto z = vae_->denormalize_latents(unpack(latents, h, w).to(dtype));
  const auto images = vae_->decode(z).select(2, 0);  // [N, 3, H, W]
  // VaeImageProcessor.postprocess(output_type="np"): denormalize, then [N, H, W, 3] float32.
  return (images * 0.5 + 0.5).clamp(0, 1).cpu().permute({0, 2, 3, 1}).to(at::kFloat).contiguous();
}

}  // namespace omni::models
