#include "worker/wan/wan_stage_base.h"

#include <ATen/ATen.h>

#include <cstring>

#include "model_runner/preprocess/image.h"
#include "worker/diffusers/diffusers_folder.h"
#include "worker/diffusers/diffusion_params.h"
#include "worker/diffusers/diffusion_stage_common.h"

namespace omni::pipeline::local {
namespace {

// The request's image (the first image file) as [H, W, 3] uint8; undefined without one.
at::Tensor request_image(const StageCall& call) {
  const MediaFile* image = nullptr;
  for (const auto& m : call.media) {
    if (m.kind != "image") continue;
    if (image != nullptr) {
      throw StageError(StageError::Code::kInvalidArgument, "",
                       "a diffusion request takes one image, got more");
    }
    image = &m;
  }
  if (image == nullptr) return {};
  const auto rgb = models::decode_image(reinterpret_cast<const uint8_t*>(image->data.data()),
                                        image->data.size(), image->name);
  auto t = at::empty({rgb.height, rgb.width, 3}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), rgb.pixels.data(), rgb.pixels.size());
  return t;
}

models::WanRequest wan_request(const DiffusionParams& p, const StageCall& call) {
  models::WanRequest r;
  const auto& d = p.request;
  OMNI_CHECK(!d.true_cfg_scale && !d.num_images,
             "true_cfg_scale and num_images are Qwen-Image's; a Wan pipeline makes one video with "
             "guidance_scale");
  r.prompt = p.prompt;
  r.negative_prompt = d.negative_prompt.value_or("");
  r.height = d.height.value_or(r.height);
  r.width = d.width.value_or(r.width);
  r.num_frames = d.num_frames.value_or(r.num_frames);
  r.num_inference_steps = d.num_inference_steps.value_or(r.num_inference_steps);
  r.max_sequence_length = d.max_sequence_length.value_or(r.max_sequence_length);
  r.guidance_scale = d.guidance_scale.value_or(r.guidance_scale);
  r.guidance_scale_2 = d.guidance_scale_2;
  r.boundary_ratio = d.boundary_ratio;
  r.flow_shift = d.flow_shift;
  r.seed = d.seed.value_or(r.seed);
  r.image = request_image(call);
  return r;
}

}  // namespace

StageInfo WanStageBase::info() {
  StageInfo i;
  i.model_stage = model_stage_;
  return with_bytes(std::move(i));
}

WanStageBase::WanStageBase(const LocalStageOptions& o, std::string model_stage)
    : LocalStageBase(o), model_stage_(std::move(model_stage)) {
  const auto start = Clock::now();
  const auto dtype = o.dtype == at::ScalarType::Undefined ? at::kFloat : o.dtype;
  const auto config = diffusion_offload_config(o);
  fps_ = diffusers_frame_rate(o.model_dir);
  pipe_ = models::load_wan_pipeline(o.model_dir, dtype);
  backend_ = offload::apply_offload(*pipe_, pipe_->offload_spec(), config, engine_);
  load_ms_ = ms_since(start);
}

models::WanRequest WanStageBase::read_request(const StageCall& call) {
  const auto params = params_as<DiffusionParams>(call, diffusion_params);
  models::WanRequest request;
  translate_errors([&] {
    request = wan_request(*params, call);
    pipe_->validate(request);
  });
  return request;
}

models::WanStepCallback WanStageBase::progress(const StageCall& call, const CancelToken& cancel,
                                               const PacketSink& sink, StepClock& clock) {
  return [&call, &cancel, &sink, &clock](const models::WanStep& step) {
    if (cancel.cancelled()) return false;
    check_going(call, cancel);  // the deadline
    const double step_ms = ms_since(clock.last);
    clock.last = Clock::now();
    clock.steps_ms += step_ms;
    sink(diffusion_step_packet(step.index, step.total, step.timestep, step_ms));
    return true;
  };
}

}  // namespace omni::pipeline::local
