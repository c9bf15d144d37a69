// The in-process stages of the Wan kinds (family.cc registers them).
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
