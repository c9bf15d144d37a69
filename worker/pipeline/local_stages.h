// Stages that run a model in this process: the thinker (ThinkerRunner), the talker
// (TalkerRunner) and code2wav (Code2WavRunner) of a Qwen3-Omni checkpoint. The in-process
// pipeline uses them directly; a worker serves one of them over gRPC.
//
// Packets each stage writes (tensors float32/the model's dtype on the CPU):
//   thinker   first packet: the first token and its text, and with `handoff` the prompt's rows:
//             "prompt_ids" [L] int64, "embeds" / "hidden" [L, H], "tts_embeds" [3, H],
//             "stop_tokens" [s] int64, "image_grids" [k, 3] int64; then one packet per token
//             with the rows of the token fed back before it ("embeds" / "hidden" [1, H]); the
//             last packet is `finished` (reason stop | length | cancelled) with metrics.
//   talker    one packet per codec frame; the last `finished` (stop | length | cancelled |
//             none when the thinker said too little to speak).
//   code2wav  one packet per decoded chunk (`audio`); the last `finished`, with the reference
//             decode of all frames as "waveform" when asked for.
//   diffusion one packet per denoising step (metrics step, steps, timestep, step_ms); the last
//             `finished` (stop | cancelled) with "frames" [F, H, W, 3] float32 in [0, 1] and
//             metrics load_ms, generate_ms, step_ms_mean, decode_ms, fps (diffusion_stage.cc).
//   diffusion_encode / diffusion_denoise / diffusion_decode  the diffusion stage's steps apart:
//             "prompt_embeds" (+ "negative_embeds", "image_latent"), then step packets and
//             "latents", then "frames" (diffusion_split_stages.cc).
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <string>

#include "cpu_offload/transfer_engine.h"
#include "model_runner/runner/offload_options.h"
#include "worker/pipeline/stage.h"
#include "worker/runtime/engine_loop.h"

namespace omni::pipeline {

struct LocalStageOptions {
  std::string name;         // "stage 1 (talker)"
  std::string model_stage;  // thinker | talker | code2wav
  std::string model_dir;
  at::ScalarType dtype = at::ScalarType::Undefined;  // Undefined: the checkpoint's
  // Component names as the pipeline's list writes them: each stage keeps the names of its part.
  models::RunnerOffloadOptions offload;
  // The whole stage gives its device memory back when the pipeline's device ledger asks
  // (set_device_released): every top-level part of the stage is a component that stays on the
  // device once loaded, until released. Replaces `offload`.
  bool offload_stage = false;
  offload::DeviceKind device = offload::DeviceKind::kCpuSim;
  // The stage's transfer engine (the simulated device's bandwidth, for benches).
  offload::TransferEngineOptions engine;
  // Continuous batching (the thinker): sequences at once, prompt tokens per step, queue bound.
  EngineLimits limits;
  // KV cache: tokens per block, and the device bytes all sequences' caches may take (0: no
  // limit; admission then only counts them).
  int64_t kv_block_size = 16;
  uint64_t kv_cache_memory_bytes = 0;
};

// Loads the stage's part of the checkpoint. Throws omni::Error naming the file / field, or
// StageError kInvalidArgument for an unknown model_stage.
std::unique_ptr<Stage> make_local_stage(const LocalStageOptions& options);

}  // namespace omni::pipeline
