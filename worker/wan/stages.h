// The in-process stages of the Wan kinds (family.cc registers them). Packets:
//   diffusion one packet per denoising step (metrics step, steps, timestep, step_ms); the last
//             `finished` (stop | cancelled) with "frames" [F, H, W, 3] float32 in [0, 1] and
//             metrics load_ms, generate_ms, step_ms_mean, decode_ms, fps (diffusion_stage.cc).
//   diffusion_encode / diffusion_denoise / diffusion_decode  the diffusion stage's steps apart:
//             "prompt_embeds" (+ "negative_embeds", "image_latent"), then step packets and
//             "latents", then "frames" (diffusion_split_stages.cc).
#pragma once

#include <memory>

#include "worker/pipeline/local_stages.h"

namespace omni::pipeline::local {

// A diffusers Wan folder as one stage (diffusion_stage.cc).
std::unique_ptr<Stage> make_diffusion_stage(const LocalStageOptions& options);
// Its encode / denoise / decode steps as three stages (diffusion_split_stages.cc).
std::unique_ptr<Stage> make_diffusion_encode_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_diffusion_denoise_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_diffusion_decode_stage(const LocalStageOptions& options);

}  // namespace omni::pipeline::local
