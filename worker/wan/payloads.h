// What the Wan kinds hand on (StagePacket's payload): the encoder's conditioning for the
// denoiser, the denoiser's latents for the decoder, and the decoded video frames. Each names
// its tensors on the wire in one place, here.
#pragma once

#include <ATen/core/Tensor.h>

#include "model_runner/diffusion/wan_pipeline.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

// diffusion_encode -> diffusion_denoise.
struct WanConditioningPayload : Payload {
  models::WanConditioning conditioning;

  NamedTensors tensors() const override;
  static WanConditioningPayload read(const NamedTensors& wire);
};

// diffusion_denoise -> diffusion_decode: the last step's latents.
struct WanLatents : Payload {
  at::Tensor latents;

  NamedTensors tensors() const override { return {{"latents", latents}}; }
  static WanLatents read(const NamedTensors& wire);
};

// The last packet of diffusion and diffusion_decode: [F, H, W, 3] float32 in [0, 1].
struct VideoFrames : Payload {
  at::Tensor frames;

  NamedTensors tensors() const override { return {{"frames", frames}}; }
  static VideoFrames read(const NamedTensors& wire);
};

}  // namespace omni::pipeline
