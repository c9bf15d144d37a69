// What the diffusion families' stages and kinds share (worker/wan, worker/qwen_image): the
// offload strategy their options name, the engine keys they do not read, their parameters for a
// request and their step packets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_config.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/request.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

// engine_args keys a diffusion stage does not read: it has no KV cache nor prompt tokens to
// schedule, and its pipelines have no experts nor disk tier. `batched`: the stage batches
// requests on an engine loop (it reads max_num_seqs); otherwise it runs one at a time.
const std::vector<std::string>& diffusion_ignored_keys(bool batched = false);

// StageKind::params of every diffusion kind: the request's prompt and its DiffusionRequest.
std::shared_ptr<const StageParams> diffusion_stage_params(const Request& request, bool speak);

// The packet a denoising step writes (metrics step (1-based), steps, timestep, step_ms).
StagePacket diffusion_step_packet(int64_t index, int64_t total, double timestep, double step_ms);

namespace local {

// vLLM-Omni's keys: enable_cpu_offload is model-level offload of the pipeline's parts, as its
// diffusion engine does; enable_layerwise_offload streams the transformer's blocks. Throws
// omni::Error naming the stage for a combination a diffusion stage cannot run.
offload::OffloadConfig diffusion_offload_config(const LocalStageOptions& options);

}  // namespace local
}  // namespace omni::pipeline
