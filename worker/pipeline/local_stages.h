// Stages that run a model in this process, whatever family's: the options every kind's
// factory reads (a family's make_local, stage_kind.h). The in-process pipeline uses them
// directly; a worker serves one of them over gRPC.
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
  std::string name;         // "stage 1 (<its kind>)"
  std::string model_stage;  // a registered kind (model_family.h)
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
  // Continuous batching (a kind that batches): sequences at once, prompt tokens per step, queue
  // bound.
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
