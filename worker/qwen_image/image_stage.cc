// The image stage: models::QwenImagePipeline under the stage's offload strategy
// (diffusion_offload_config: enable_cpu_offload makes text encoder, transformer and VAE take
// turns on the device, enable_layerwise_offload streams the transformer's blocks).
#include "worker/qwen_image/image_stage.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <memory>
#include <mutex>

#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/preprocess/image.h"
#include "worker/diffusers/diffusion_params.h"
#include "worker/diffusers/diffusion_stage_common.h"
#include "worker/pipeline/local_stage_base.h"

namespace omni::pipeline::local {
namespace {

// The request's settings over the pipeline's defaults; a Wan field is refused by name.
models::QwenImageRequest image_request(const DiffusionParams& p, const StageCall& call) {
  const auto& d = p.request;
  OMNI_CHECK(!d.num_frames && !d.guidance_scale && !d.guidance_scale_2 && !d.boundary_ratio &&
                 !d.flow_shift,
             "num_frames, guidance_scale, guidance_scale_2, boundary_ratio and flow_shift are "
             "video settings; an image model takes true_cfg_scale");
  models::QwenImageRequest r;
  // The images to edit, in the request's order; the pipeline says how many its folder takes.
  for (const auto& m : call.media) {
    if (m.kind != "image") continue;
    r.images.push_back(models::decode_image(reinterpret_cast<const uint8_t*>(m.data.data()),
                                            m.data.size(), m.name));
  }
  r.prompt = p.prompt;
  r.negative_prompt = d.negative_prompt;
  r.height = d.height.value_or(r.height);
  r.width = d.width.value_or(r.width);
  r.num_inference_steps = d.num_inference_steps.value_or(r.num_inference_steps);
  r.true_cfg_scale = d.true_cfg_scale.value_or(r.true_cfg_scale);
  r.num_images = d.num_images.value_or(r.num_images);
  r.max_sequence_length = d.max_sequence_length.value_or(r.max_sequence_length);
  r.seed = d.seed.value_or(r.seed);
  return r;
}

class ImageStage : public LocalStageBase {
 public:
  explicit ImageStage(const LocalStageOptions& o) : LocalStageBase(o) {
    const auto start = Clock::now();
    const auto dtype = o.dtype == at::ScalarType::Undefined ? at::kFloat : o.dtype;
    const auto config = diffusion_offload_config(o);
    pipe_ = models::load_qwen_image_pipeline(o.model_dir, dtype);
    backend_ = offload::apply_offload(*pipe_, pipe_->offload_spec(), config, engine_);
    load_ms_ = ms_since(start);
  }

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "qwen_image";
    return with_bytes(std::move(i));
  }

  // An entry stage: it reads the request, not `input`.
  void run(const StageCall& call, PacketQueue& /*input*/, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;
    const auto params = params_as<DiffusionParams>(call, diffusion_params);
    models::QwenImageRequest request;
    translate_errors([&] {
      request = image_request(*params, call);
      pipe_->validate(request);
    });
    // One request at a time: the pipeline's modules and offload bindings are shared.
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    auto last = start;
    double steps_ms = 0;
    const auto on_step = [&](const models::QwenImageStep& step) {
      if (cancel.cancelled()) return false;
      check_going(call, cancel);  // the deadline
      const double step_ms = ms_since(last);
      last = Clock::now();
      steps_ms += step_ms;
      sink(diffusion_step_packet(step.index, step.total, step.timestep, step_ms));
      return true;
    };
    models::QwenImageResult result;
    translate_errors([&] {
      auto scope = backend_->forward_scope();
      result = pipe_->generate(request, on_step, engine_->compute_device());
    });
    StagePacket done;
    done.finished = true;
    done.finish_reason = result.cancelled ? "cancelled" : "stop";
    if (!result.cancelled) {
      auto out = std::make_shared<StillImages>();
      out->images = cpu(result.images.to(at::kFloat));
      done.payload = std::move(out);
    }
    const double steps = static_cast<double>(request.num_inference_steps);
    done.metrics = {{"load_ms", load_ms_},
                    {"generate_ms", ms_since(start)},
                    {"steps", steps},
                    {"step_ms_mean", steps > 0 ? steps_ms / steps : 0.0},
                    {"decode_ms", result.cancelled ? 0.0 : ms_since(last)}};
    sink(std::move(done));
  }

 protected:
  offload::OffloadBackend& backend() override { return *backend_; }

 private:
  std::shared_ptr<models::QwenImagePipeline> pipe_;
  std::unique_ptr<offload::OffloadBackend> backend_;
  double load_ms_ = 0;
};

}  // namespace

std::unique_ptr<Stage> make_image_stage(const LocalStageOptions& options) {
  return std::make_unique<ImageStage>(options);
}

}  // namespace omni::pipeline::local
