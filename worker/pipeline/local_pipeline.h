// A stage config's stages in this process: what `generate` and `serve` run for `--model`, and
// what a worker serves for its one stage. Also the checkpoint's own stage config, so that a model
// folder and a YAML go through the same flags, overrides and pipeline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"
#include "worker/pipeline/device_ledger.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/pipeline.h"

namespace omni::pipeline {

// The stages of the checkpoint in `model_dir`, as the family that claims the folder lays them out
// (ModelFamily::checkpoint_graph). `device`: "cpu" (the simulated device) or "cuda";
// `dtype`: auto | float32 | bfloat16 | float16.
config::PipelineConfig checkpoint_stage_config(const std::string& model_dir,
                                               const std::string& device, const std::string& dtype);

// Every stage of `config` in this process on `device` ("cpu" | "cuda"; empty: runtime.devices),
// with the device ledger of their shared device when a stage has a gpu_memory_budget.
// `engine`: every stage's transfer engine options.
std::unique_ptr<Pipeline> make_local_pipeline(const config::PipelineConfig& config,
                                              const std::string& device,
                                              const offload::TransferEngineOptions& engine = {});

// "stage 1 (<its kind>)".
std::string stage_name(const config::StageConfig& stage);

// The device ledger of `config`'s stages (`stages[i]` runs config.stages[i]), or null when no
// stage has a gpu_memory_budget and none may leave its device (offload_stage,
// enable_cpu_offload). On a device without a budget, the stages that may leave take turns: its
// budget holds the stages that stay plus the largest that moves. Throws omni::Error when a device's
// budget cannot hold its fixed stages plus the largest one that moves.
std::shared_ptr<DeviceLedger> make_device_ledger(const config::PipelineConfig& config,
                                                 const std::vector<std::shared_ptr<Stage>>& stages);

// The engine_args keys `stage` sets to other than their default that its kind does not read
// (StageKind::ignored_keys), in the options table's order; warn_ignored_engine_keys logs them
// once, naming the stage. Called where a stage starts: make_local_pipeline, `vllm-omni worker`.
std::vector<std::string> ignored_engine_keys(const config::StageConfig& stage);
void warn_ignored_engine_keys(const config::StageConfig& stage);

// What runs `stage` in this process: its engine settings as the in-process stage's options.
// `device` ("cpu" | "cuda") overrides runtime.devices ("cpu": the simulated device, an index:
// CUDA).
LocalStageOptions local_stage_options(const config::StageConfig& stage,
                                      const std::string& device = "");

}  // namespace omni::pipeline
