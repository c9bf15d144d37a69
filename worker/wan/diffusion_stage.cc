// The diffusion stage: a diffusers Wan folder (models::WanPipeline) as one entry stage. It
// writes one packet per denoising step (metrics step, steps, timestep, step_ms) and a last one
// with the frames ("frames" [F, H, W, 3] float32 in [0, 1]) and its timings. The pipeline is the
// offload engine's root: enable_cpu_offload (offload_stage) makes its parts take turns on the
// device (model-level), enable_layerwise_offload streams the transformers' blocks.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <memory>

#include "worker/wan/payloads.h"
#include "worker/wan/stages.h"
#include "worker/wan/wan_stage_base.h"

namespace omni::pipeline::local {
namespace {

class DiffusionStage : public WanStageBase {
 public:
  explicit DiffusionStage(const LocalStageOptions& o) : WanStageBase(o, "diffusion") {}

  // An entry stage: it reads the request, not `input`.
  void run(const StageCall& call, PacketQueue& /*input*/, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;
    const auto request = read_request(call);
    // One request at a time: the pipeline's modules and offload bindings are shared.
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    StepClock clock;
    models::WanResult result;
    translate_errors([&] {
      auto scope = backend_->forward_scope();
      result =
          pipe_->generate(request, progress(call, cancel, sink, clock), engine_->compute_device());
    });
    StagePacket done;
    done.finished = true;
    done.finish_reason = result.cancelled ? "cancelled" : "stop";
    if (!result.cancelled) {
      auto out = std::make_shared<VideoFrames>();
      out->frames = cpu(result.frames.to(at::kFloat));
      done.payload = std::move(out);
    }
    const double steps = static_cast<double>(request.num_inference_steps);
    done.metrics = {{"load_ms", load_ms_},
                    {"generate_ms", ms_since(start)},
                    {"steps", steps},
                    {"step_ms_mean", steps > 0 ? clock.steps_ms / steps : 0.0},
                    {"decode_ms", result.cancelled ? 0.0 : ms_since(clock.last)},
                    {"fps", static_cast<double>(fps_)}};
    sink(std::move(done));
  }
};

}  // namespace

std::unique_ptr<Stage> make_diffusion_stage(const LocalStageOptions& options) {
  return std::make_unique<DiffusionStage>(options);
}

}  // namespace omni::pipeline::local
