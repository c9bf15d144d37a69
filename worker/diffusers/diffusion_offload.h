// The offload strategy a diffusion stage's options name (vLLM-Omni's keys: enable_cpu_offload is
// model-level offload of the pipeline's parts, as its diffusion engine does;
// enable_layerwise_offload streams the transformer's blocks).
#pragma once

#include "cpu_offload/offload_config.h"
#include "worker/pipeline/local_stages.h"

namespace omni::pipeline::local {

// Throws omni::Error naming the stage for a combination a diffusion stage cannot run.
offload::OffloadConfig diffusion_offload_config(const LocalStageOptions& options);

}  // namespace omni::pipeline::local
