#include "worker/pipeline/local_stages.h"

#include "model_runner/runner/speech_runners.h"
#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

std::unique_ptr<Stage> make_local_stage(const LocalStageOptions& options) {
  if (options.offload.cpu_offload_enabled) {
    models::check_component_names(options.offload.components);
  }
  const StageKind* kind = find_stage_kind(options.model_stage);
  if (kind == nullptr || !kind->make_local) {
    throw StageError(
        StageError::Code::kInvalidArgument, options.name,
        "model_stage '" + options.model_stage + "' cannot run here (" + stage_kind_names() + ")");
  }
  return kind->make_local(options);
}

}  // namespace omni::pipeline
