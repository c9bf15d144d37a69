// A diffusion stage's parameters for one request (StageParams): the prompt and the request's
// DiffusionRequest. In one process the struct reaches the stage as it is; a worker reads the
// JSON back with diffusion_params. The input image travels as bytes in StageCall::media.
#pragma once

#include <string>

#include "model_runner/runner/diffusion_request.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

struct DiffusionParams : StageParams {
  std::string prompt;
  models::DiffusionRequest request;

  // Unset fields are left out, so a worker keeps its pipeline's defaults too.
  std::string to_json() const override;
};

// Throws StageError kInvalidArgument naming the field.
DiffusionParams diffusion_params(const std::string& json);

}  // namespace omni::pipeline
