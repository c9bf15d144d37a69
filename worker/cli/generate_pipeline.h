// `vllm-omni generate --stage-configs-path F`: the request goes through the stage workers of the
// config (worker/pipeline/stage_launcher.h), with the command line's offload flags and
// --stage-overrides applied to the config first (precedence: overrides > flags > YAML).
#pragma once

#include <memory>
#include <stdexcept>

#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"

namespace omni::cli {

// A mistake in what the user gave (a bad stage config): the command exits 2, as for a bad flag.
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Starts the workers and waits until every stage is healthy. Throws BadInput for a bad config,
// omni::Error when a stage does not come up; in a build without gRPC, omni::Error saying so.
std::unique_ptr<GenerateBackend> make_pipeline_backend(const GenerateOptions& options);

}  // namespace omni::cli
