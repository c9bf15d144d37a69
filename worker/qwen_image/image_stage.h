// The image stage of the Qwen-Image family (family.cc registers it): a diffusers
// QwenImagePipeline folder as one entry stage. Packets: one per denoising step (metrics step,
// steps, timestep, step_ms); the last `finished` (stop | cancelled) with "images"
// [N, H, W, 3] float32 in [0, 1] and metrics load_ms, generate_ms, step_ms_mean, decode_ms.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

// The image stage's last packet: [N, H, W, 3] float32 in [0, 1].
struct StillImages : Payload {
  at::Tensor images;

  NamedTensors tensors() const override { return {{"images", images}}; }
  static StillImages read(const NamedTensors& wire) {
    StillImages p;
    p.images = named_tensor(wire, "images");
    return p;
  }
};

namespace local {

std::unique_ptr<Stage> make_image_stage(const LocalStageOptions& options);

}  // namespace local
}  // namespace omni::pipeline
