// What the stages over a diffusers Wan folder share (diffusion_stage.cc: the whole pipeline;
// diffusion_split_stages.cc: its encode / denoise / decode steps as three stages): loading the
// pipeline under the stage's offload strategy, the request it reads, and its progress packets.
#pragma once

#include <memory>
#include <string>

#include "cpu_offload/offload_backend.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "worker/pipeline/local_stage_base.h"

namespace omni::pipeline::local {

// The denoising loop's timing, kept by the progress callback for the stage's last packet.
struct StepClock {
  Clock::time_point last = Clock::now();
  double steps_ms = 0;
};

class WanStageBase : public LocalStageBase {
 public:
  // Loads the whole folder (every step needs its config; only the called parts run).
  // `model_stage`: what info() reports ("diffusion", "diffusion_encode", ...).
  WanStageBase(const LocalStageOptions& o, std::string model_stage);
  StageInfo info() override;

 protected:
  offload::OffloadBackend& backend() override { return *backend_; }
  // The call's DiffusionParams (and its image, for an entry stage) as a validated WanRequest;
  // throws StageError kInvalidArgument naming the field.
  models::WanRequest read_request(const StageCall& call);
  // A step callback that writes one packet per step (metrics step, steps, timestep, step_ms)
  // and stops the loop when the request is cancelled or past its deadline.
  models::WanStepCallback progress(const StageCall& call, const CancelToken& cancel,
                                   const PacketSink& sink, StepClock& clock);

  std::shared_ptr<models::WanPipeline> pipe_;
  std::unique_ptr<offload::OffloadBackend> backend_;
  int64_t fps_ = 16;
  double load_ms_ = 0;

 private:
  std::string model_stage_;
};

}  // namespace omni::pipeline::local
