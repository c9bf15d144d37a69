// A diffusers Wan folder as three stages, vLLM-Omni's encode / denoise / decode split (its
// qwen_image_3stage.yaml), so the text encoder and VAE can sit on another device than the
// transformers. Each runs one step of models::WanPipeline::generate on the packet of the one
// before:
//   diffusion_encode   the request in; one `finished` packet with the conditioning
//                      (WanConditioningPayload, payloads.h).
//   diffusion_denoise  one packet per step (as the diffusion stage writes them); the last
//                      `finished` with the latents (WanLatents; stop | cancelled).
//   diffusion_decode   the last `finished` packet with the frames (VideoFrames) and metrics
//                      decode_ms, fps.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <memory>
#include <optional>
#include <string>

#include "worker/wan/payloads.h"
#include "worker/wan/stages.h"
#include "worker/wan/wan_stage_base.h"

namespace omni::pipeline::local {
namespace {

// The source's `finished` packet (the others are its progress); throws when it never came.
StagePacket last_packet(PacketQueue& input, const CancelToken& cancel, const std::string& stage) {
  std::optional<StagePacket> last;
  while (auto packet = input.pop(&cancel)) {
    if (packet->finished) last = std::move(*packet);
  }
  if (!last) throw StageError(StageError::Code::kInternal, stage, "its source sent no last packet");
  return std::move(*last);
}

// A `finished` packet saying why there is no output (the source's reason).
StagePacket stopped(const std::string& reason) {
  StagePacket p;
  p.finished = true;
  p.finish_reason = reason;
  return p;
}

class EncodeStage : public WanStageBase {
 public:
  explicit EncodeStage(const LocalStageOptions& o) : WanStageBase(o, "diffusion_encode") {}

  void run(const StageCall& call, PacketQueue& /*input*/, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;
    const auto request = read_request(call);
    std::lock_guard<std::mutex> lock(mutex_);
    check_going(call, cancel);
    const auto start = Clock::now();
    models::WanConditioning c;
    translate_errors([&] {
      auto scope = backend_->forward_scope();
      c = pipe_->encode(request, engine_->compute_device());
    });
    StagePacket done = stopped("stop");
    auto out = std::make_shared<WanConditioningPayload>();
    out->conditioning.prompt_embeds = cpu(c.prompt_embeds);
    if (c.negative_embeds.defined()) out->conditioning.negative_embeds = cpu(c.negative_embeds);
    if (c.image_latent.defined()) out->conditioning.image_latent = cpu(c.image_latent);
    done.payload = std::move(out);
    done.metrics = {{"load_ms", load_ms_}, {"encode_ms", ms_since(start)}};
    sink(std::move(done));
  }
};

class DenoiseStage : public WanStageBase {
 public:
  explicit DenoiseStage(const LocalStageOptions& o) : WanStageBase(o, "diffusion_denoise") {}

  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;
    const auto request = read_request(call);
    const auto source = last_packet(input, cancel, name_);
    const auto in = payload_as<WanConditioningPayload>(source, &WanConditioningPayload::read);
    if (!in || !in->conditioning.prompt_embeds.defined()) {
      return sink(stopped(source.finish_reason));
    }
    const models::WanConditioning& c = in->conditioning;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    StepClock clock;
    at::Tensor latents;
    translate_errors([&] {
      auto scope = backend_->forward_scope();
      latents = pipe_->denoise(request, c, progress(call, cancel, sink, clock),
                               engine_->compute_device());
    });
    StagePacket done = stopped(latents.defined() ? "stop" : "cancelled");
    if (latents.defined()) {
      auto out = std::make_shared<WanLatents>();
      out->latents = cpu(latents);
      done.payload = std::move(out);
    }
    const double steps = static_cast<double>(request.num_inference_steps);
    done.metrics = {{"load_ms", load_ms_},
                    {"generate_ms", ms_since(start)},
                    {"steps", steps},
                    {"step_ms_mean", steps > 0 ? clock.steps_ms / steps : 0.0}};
    sink(std::move(done));
  }
};

class DecodeStage : public WanStageBase {
 public:
  explicit DecodeStage(const LocalStageOptions& o) : WanStageBase(o, "diffusion_decode") {}

  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;
    const auto source = last_packet(input, cancel, name_);
    const auto in = payload_as<WanLatents>(source, &WanLatents::read);
    if (!in || !in->latents.defined()) return sink(stopped(source.finish_reason));
    const at::Tensor& latents = in->latents;
    std::lock_guard<std::mutex> lock(mutex_);
    check_going(call, cancel);
    const auto start = Clock::now();
    at::Tensor frames;
    translate_errors([&] {
      auto scope = backend_->forward_scope();
      frames = pipe_->decode_latents(latents.to(engine_->compute_device()));
    });
    StagePacket done = stopped("stop");
    auto out = std::make_shared<VideoFrames>();
    out->frames = cpu(frames.to(at::kFloat));
    done.payload = std::move(out);
    done.metrics = {
        {"load_ms", load_ms_}, {"decode_ms", ms_since(start)}, {"fps", static_cast<double>(fps_)}};
    sink(std::move(done));
  }
};

}  // namespace

std::unique_ptr<Stage> make_diffusion_encode_stage(const LocalStageOptions& options) {
  return std::make_unique<EncodeStage>(options);
}
std::unique_ptr<Stage> make_diffusion_denoise_stage(const LocalStageOptions& options) {
  return std::make_unique<DenoiseStage>(options);
}
std::unique_ptr<Stage> make_diffusion_decode_stage(const LocalStageOptions& options) {
  return std::make_unique<DecodeStage>(options);
}

}  // namespace omni::pipeline::local
