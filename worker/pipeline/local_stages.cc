#include "worker/pipeline/local_stages.h"

#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

std::unique_ptr<Stage> make_local_stage(const LocalStageOptions& options) {
  const StageKind* kind = find_stage_kind(options.model_stage);
  if (kind == nullptr || !kind->make_local) {
    throw StageError(
        StageError::Code::kInvalidArgument, options.name,
        "model_stage '" + options.model_stage + "' cannot run here (" + stage_kind_names() + ")");
  }
  return kind->make_local(options);
}

}  // namespace omni::pipeline
