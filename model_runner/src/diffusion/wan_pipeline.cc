// WanPipeline::generate: diffusers' pipeline_wan.py __call__ (and, for a TI2V image, the
// expand_timesteps path of pipeline_wan_i2v.py), line for line where the numbers depend on it.
#include "model_runner/diffusion/wan_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cctype>
#include <string>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

// diffusers' prompt_clean without ftfy / html.unescape: runs of whitespace become one space,
// ends stripped.
std::string prompt_clean(const std::string& text) {
  std::string out;
  bool space = false;
  for (const char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

at::Tensor to_tensor(const std::vector<int32_t>& v) {
  return at::tensor(std::vector<int64_t>(v.begin(), v.end()), at::kLong).unsqueeze(0);
}

}  // namespace

void WanPipeline::validate(const WanRequest& r) const {
  const auto& vae = vae_->config();
  const auto& t = transformer_->config();
  // check_inputs' 16, and the patchification multiple diffusers would round down to.
  const int64_t h_multiple = vae.scale_factor_spatial * t.patch_h;
  const int64_t w_multiple = vae.scale_factor_spatial * t.patch_w;
  OMNI_CHECK(r.height > 0 && r.height % 16 == 0 && r.height % h_multiple == 0,
             "WanRequest.height must be a positive multiple of 16 and of ", h_multiple,
             " (VAE spatial factor x patch), got ", r.height);
  OMNI_CHECK(r.width > 0 && r.width % 16 == 0 && r.width % w_multiple == 0,
             "WanRequest.width must be a positive multiple of 16 and of ", w_multiple,
             " (VAE spatial factor x patch), got ", r.width);
  OMNI_CHECK(r.num_frames >= 1 && (r.num_frames - 1) % vae.scale_factor_temporal == 0,
             "WanRequest.num_frames must be ", vae.scale_factor_temporal, "k + 1, got ",
             r.num_frames);
  OMNI_CHECK(r.num_inference_steps >= 1, "WanRequest.num_inference_steps must be >= 1, got ",
             r.num_inference_steps);
  OMNI_CHECK(r.max_sequence_length >= 1, "WanRequest.max_sequence_length must be >= 1, got ",
             r.max_sequence_length);
  const auto boundary = r.boundary_ratio ? r.boundary_ratio : config_.boundary_ratio;
  OMNI_CHECK(!r.guidance_scale_2 || boundary,
             "WanRequest.guidance_scale_2 needs a boundary_ratio (model_index.json or the "
             "request): without one transformer_2 never runs");
  OMNI_CHECK(!r.boundary_ratio || transformer_2_, "WanRequest.boundary_ratio is set but ", dir_,
             " has no transformer_2");
  OMNI_CHECK(!boundary || (*boundary >= 0 && *boundary <= 1),
             "WanRequest.boundary_ratio must be in [0, 1], got ", *boundary);
  OMNI_CHECK(!r.flow_shift || *r.flow_shift > 0, "WanRequest.flow_shift must be > 0, got ",
             r.flow_shift.value_or(0));
  if (r.image.defined()) {
    OMNI_CHECK(config_.expand_timesteps, "WanRequest.image needs a TI2V folder (model_index.json ",
               "expand_timesteps true); ", dir_, " is text-to-video only");
    OMNI_CHECK(r.image.dim() == 3 && r.image.size(2) == 3,
               "WanRequest.image must be [height, width, 3], got ", r.image.sizes());
    OMNI_CHECK(r.image.size(0) == r.height && r.image.size(1) == r.width, "WanRequest.image is ",
               r.image.size(0), "x", r.image.size(1), " but the request is ", r.height, "x",
               r.width, " (resizing is not supported)");
    OMNI_CHECK(r.image.scalar_type() == at::kByte || at::isFloatingType(r.image.scalar_type()),
               "WanRequest.image must be uint8 or floating point, got ", r.image.scalar_type());
  }
}

at::Tensor WanPipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length,
                                      bool negative, const WanTrace* trace, c10::Device device) {
  const auto padded = tokenizer_.encode_padded(
      prompt_clean(prompt), static_cast<size_t>(max_sequence_length), tokenizer_.token_id("<pad>"));
  const auto ids = to_tensor(padded.ids);
  const auto mask = to_tensor(padded.attention_mask);
  const int64_t seq_len = mask.gt(0).sum().item<int64_t>();
  const auto hidden = text_encoder_->forward(ids.to(device), mask.to(device)).to(device);
  // Cut to the real tokens and pad back with zeros: the padding rows carry values in
  // last_hidden_state that the transformer must not see.
  const auto real = hidden[0].slice(0, 0, seq_len);
  auto embeds =
      at::cat({real, real.new_zeros({max_sequence_length - seq_len, real.size(1)})}).unsqueeze(0);
  if (trace && trace->prompt) trace->prompt(negative, ids, mask, embeds);
  return embeds;
}

at::Tensor WanPipeline::encode_image(const at::Tensor& image, c10::Device device) {
  // VaeImageProcessor.preprocess: uint8 / 255 in float32 (pil_to_numpy), then 2x - 1.
  auto x = image.scalar_type() == at::kByte ? image.to(at::kFloat) / 255.0 : image.to(at::kFloat);
  x = 2.0 * x - 1.0;
  // [H, W, 3] -> [1, 3, 1, H, W] (a one-frame video).
  const auto video = x.permute({2, 0, 1}).unsqueeze(0).unsqueeze(2).contiguous();
  const auto param = vae_->parameters().front();
  const auto latent = vae_->encode(video.to(device, param.scalar_type())).mode();
  return vae_->normalize_latents(latent.to(device, at::kFloat));
}

at::Tensor WanPipeline::decode_latents(const at::Tensor& latents) {
  c10::InferenceMode guard;
  const auto dtype = vae_->parameters().front().scalar_type();
  const auto z = vae_->denormalize_latents(latents.to(dtype));
  // The frames go straight into the result, a chunk at a time: the decode holds one chunk's
  // activations and frames beside the video, not copies of the whole video.
  const auto& vae = vae_->config();
  const int64_t frames = 1 + vae.scale_factor_temporal * (z.size(2) - 1);
  at::Tensor out;
  int64_t next = 0;
  vae_->decode_chunks(z, [&](const at::Tensor& chunk) {
    // postprocess_video(output_type="np"): [f, 3, H, W] -> denormalize -> [f, H, W, 3] float32.
    const auto f = chunk[0].permute({1, 0, 2, 3});
    const auto rgb = (f * 0.5 + 0.5).clamp(0, 1).cpu().permute({0, 2, 3, 1}).to(at::kFloat);
    if (!out.defined()) out = at::empty({frames, rgb.size(1), rgb.size(2), 3}, rgb.options());
    OMNI_CHECK(next + rgb.size(0) <= frames, "WanPipeline::decode_latents: the VAE gave more than ",
               frames, " frames");
    out.narrow(0, next, rgb.size(0)).copy_(rgb);
    next += rgb.size(0);
  });
  OMNI_CHECK(next == frames, "WanPipeline::decode_latents: the VAE gave ", next, " frames, not ",
             frames);
  return out;
}

WanResult WanPipeline::generate(const WanRequest& r, const WanStepCallback& on_step,
                                c10::Device device) {
  validate(r);
  c10::InferenceMode guard;
  const auto conditioning = encode(r, device);
  const auto latents = denoise(r, conditioning, on_step, device);
  if (!latents.defined()) return WanResult{at::Tensor(), true};
  return WanResult{decode_latents(latents), false};
}

WanConditioning WanPipeline::encode(const WanRequest& r, c10::Device device) {
  c10::InferenceMode guard;
  WanConditioning c;
  c.prompt_embeds = encode_prompt(r.prompt, r.max_sequence_length, false, r.trace, device);
  if (r.guidance_scale > 1.0) {
    c.negative_embeds =
        encode_prompt(r.negative_prompt, r.max_sequence_length, true, r.trace, device);
  }
  if (r.image.defined()) c.image_latent = encode_image(r.image, device);
  return c;
}

int WanDenoising::expert() const {
  if (!boundary_timestep) return 0;
  // diffusers compares the timestep tensor with a Python float: both in float32.
  const float t = timesteps[index].to(at::kFloat).item<float>();
  return t >= *boundary_timestep ? 0 : 1;
}

at::Tensor WanPipeline::denoise(const WanRequest& r, const WanConditioning& conditioning,
                                const WanStepCallback& on_step, c10::Device device) {
  c10::InferenceMode guard;
  auto state = start_denoise(r, conditioning, device);
  while (!state.done()) {
    const auto step = denoise_step({&state}).front();
    if (on_step && !on_step(step)) return at::Tensor();
  }
  return finish_denoise(state);
}

WanDenoising WanPipeline::start_denoise(const WanRequest& r, const WanConditioning& conditioning,
                                        c10::Device device) {
  c10::InferenceMode guard;
  WanDenoising s;
  s.trace = r.trace;
  const auto boundary_ratio = r.boundary_ratio ? r.boundary_ratio : config_.boundary_ratio;
  s.guidance_scale = r.guidance_scale;
  s.guidance_scale_2 = r.guidance_scale_2.value_or(r.guidance_scale);
  s.cfg = r.guidance_scale > 1.0;
  OMNI_CHECK(conditioning.prompt_embeds.defined(), "WanConditioning.prompt_embeds is missing");
  OMNI_CHECK(!s.cfg || conditioning.negative_embeds.defined(),
             "WanConditioning.negative_embeds is missing: guidance_scale ", r.guidance_scale,
             " runs classifier-free guidance");

  const auto transformer_dtype = transformer_->dtype();
  s.prompt_embeds = conditioning.prompt_embeds.to(device).to(transformer_dtype);
  if (s.cfg) s.negative_embeds = conditioning.negative_embeds.to(device).to(transformer_dtype);

  s.scheduler = make_scheduler(r.flow_shift);
  s.scheduler->set_timesteps(r.num_inference_steps);
  s.timesteps = s.scheduler->timesteps();
  s.total = s.timesteps.size(0);

  // prepare_latents: randn_tensor with a CPU generator draws on the CPU in float32, then moves.
  const auto& vae = vae_->config();
  const int64_t latent_frames = (r.num_frames - 1) / vae.scale_factor_temporal + 1;
  const int64_t latent_h = r.height / vae.scale_factor_spatial;
  const int64_t latent_w = r.width / vae.scale_factor_spatial;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(r.seed);
  s.latents = at::randn({1, transformer_->config().in_channels, latent_frames, latent_h, latent_w},
                        generator, at::TensorOptions().dtype(at::kFloat))
                  .to(device);
  if (s.trace && s.trace->initial_latents) s.trace->initial_latents(s.latents);

  // expand_timesteps: the mask gives each token its timestep (0 for the conditioning frame's).
  // TI2V image-to-video keeps the image latent in frame 0 (mask 0 there).
  s.mask = at::ones({1, 1, latent_frames, latent_h, latent_w},
                    at::TensorOptions().dtype(at::kFloat).device(device));
  if (conditioning.image_latent.defined()) {
    OMNI_CHECK(config_.expand_timesteps, "WanConditioning.image_latent needs a TI2V folder; ", dir_,
               " is text-to-video only");
    s.condition = conditioning.image_latent.to(device);
    s.mask.select(2, 0).zero_();
  }
  if (boundary_ratio) {
    s.boundary_timestep = static_cast<float>(*boundary_ratio * s.scheduler->num_train_timesteps());
  }
  return s;
}

std::vector<WanStep> WanPipeline::denoise_step(const std::vector<WanDenoising*>& batch) {
  c10::InferenceMode guard;
  OMNI_CHECK(!batch.empty(), "WanPipeline::denoise_step: an empty batch");
  const int expert = batch.front()->expert();
  auto& model = expert == 0 ? *transformer_ : *transformer_2_;
  const auto transformer_dtype = transformer_->dtype();

  // Each request's passes (conditional, then unconditional), all through one call.
  std::vector<WanPass> passes;
  for (auto* s : batch) {
    OMNI_CHECK(!s->done() && s->expert() == expert,
               "WanPipeline::denoise_step: a batch member is done or on the other transformer");
    const auto& latents = s->latents;
    const auto t = s->timesteps[s->index].to(latents.device());
    at::Tensor model_input;
    at::Tensor timestep;
    if (config_.expand_timesteps) {
      model_input =
          s->condition.defined() ? (1 - s->mask) * s->condition + s->mask * latents : latents;
      model_input = model_input.to(transformer_dtype);
      // (mask[0][0][:, ::2, ::2] * t).flatten(), one row per sample (the loader checked that
      // the patch is (1, 2, 2)).
      const auto per_token =
          (s->mask[0][0].slice(1, 0, c10::nullopt, 2).slice(2, 0, c10::nullopt, 2) * t).flatten();
      timestep = per_token.unsqueeze(0).expand({latents.size(0), -1});
    } else {
      model_input = latents.to(transformer_dtype);
      timestep = t.expand({latents.size(0)});
    }
    passes.push_back({model_input, timestep, s->prompt_embeds});
    if (s->cfg) passes.push_back({model_input, timestep, s->negative_embeds});
  }
  const auto preds = model.forward_passes(passes);

  std::vector<WanStep> steps;
  size_t next = 0;
  for (auto* s : batch) {
    const int64_t i = s->index;
    const auto& pass = passes[next];
    auto noise_pred = preds[next++];
    const WanTrace* trace = s->trace;
    if (trace && trace->transformer) {
      trace->transformer(i, true, pass.hidden_states, pass.timestep, noise_pred);
    }
    if (s->cfg) {
      const auto& noise_uncond = preds[next++];
      if (trace && trace->transformer) {
        trace->transformer(i, false, pass.hidden_states, pass.timestep, noise_uncond);
      }
      const double scale = expert == 0 ? s->guidance_scale : s->guidance_scale_2;
      noise_pred = noise_uncond + scale * (noise_pred - noise_uncond);
    }
    s->latents = s->scheduler->step(noise_pred, i, s->latents);
    if (trace && trace->step_latents) trace->step_latents(i, s->latents);

    WanStep step;
    step.index = i;
    step.total = s->total;
    step.timestep = s->timesteps[i].to(at::kDouble).item<double>();
    step.transformer = expert == 0 ? "transformer" : "transformer_2";
    steps.push_back(step);
    ++s->index;
  }
  return steps;
}

at::Tensor WanPipeline::finish_denoise(const WanDenoising& s) const {
  if (!s.condition.defined()) return s.latents;
  return (1 - s.mask) * s.condition + s.mask * s.latents;
}

}  // namespace omni::models
