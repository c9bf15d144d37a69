#include "worker/wan/payloads.h"

namespace omni::pipeline {

NamedTensors WanConditioningPayload::tensors() const {
  NamedTensors out = {{"prompt_embeds", conditioning.prompt_embeds}};
  if (conditioning.negative_embeds.defined()) {
    out.emplace_back("negative_embeds", conditioning.negative_embeds);
  }
  if (conditioning.image_latent.defined()) {
    out.emplace_back("image_latent", conditioning.image_latent);
  }
  return out;
}

WanConditioningPayload WanConditioningPayload::read(const NamedTensors& wire) {
  WanConditioningPayload p;
  p.conditioning.prompt_embeds = named_tensor(wire, "prompt_embeds");
  p.conditioning.negative_embeds = named_tensor(wire, "negative_embeds");
  p.conditioning.image_latent = named_tensor(wire, "image_latent");
  return p;
}

WanLatents WanLatents::read(const NamedTensors& wire) {
  WanLatents p;
  p.latents = named_tensor(wire, "latents");
  return p;
}

VideoFrames VideoFrames::read(const NamedTensors& wire) {
  VideoFrames p;
  p.frames = named_tensor(wire, "frames");
  return p;
}

}  // namespace omni::pipeline
