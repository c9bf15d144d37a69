// What runs a `vllm-omni generate` request: one Pipeline, whether its stages run in this process
// (--model: the checkpoint's own stages) or in stage workers (--stage-configs-path). The command
// line's offload flags and --stage-overrides apply to the stage config first (precedence:
// overrides > flags > YAML), the same way for both.
#pragma once

#include <memory>
#include <stdexcept>

#include "worker/cli/command_errors.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/pipeline.h"

namespace omni::cli {

// Runs requests through `pipeline`, which stays valid while `owner` lives; `config` gives the
// stages' default_sampling_params.
std::unique_ptr<GenerateBackend> make_backend(const GenerateOptions& options,
                                              config::PipelineConfig config,
                                              std::shared_ptr<void> owner,
                                              pipeline::Pipeline& pipeline);

// --model: the checkpoint's stages on `device` (cpu | cuda, resolved) with the flags and
// --stage-overrides applied. Throws BadInput for bad overrides.
config::PipelineConfig model_stage_config(const GenerateOptions& options,
                                          const std::string& device);

// --model: the checkpoint's stages in this process on `device` (cpu | cuda, resolved). Throws
// BadInput for bad overrides.
std::unique_ptr<GenerateBackend> make_model_backend(const GenerateOptions& options,
                                                    const std::string& device);

// --stage-configs-path: starts the workers and waits until every stage is healthy. Throws
// BadInput for a bad config, omni::Error when a stage does not come up; in a build without gRPC,
// omni::Error saying so.
std::unique_ptr<GenerateBackend> make_pipeline_backend(const GenerateOptions& options);

}  // namespace omni::cli
