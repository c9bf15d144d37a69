// The diffusion stage: a diffusers Wan folder (models::WanPipeline) as one entry stage. It
// writes one packet per denoising step (metrics step, steps, timestep, step_ms) and a last one
// with the frames ("frames" [F, H, W, 3] float32 in [0, 1]) and its timings. The pipeline is the
// offload engine's root: enable_cpu_offload (offload_stage) makes its parts take turns on the
// device (model-level), enable_layerwise_offload streams the transformers' blocks.
//
// Requests denoise on the stage's engine loop: a request's prompt is encoded when it joins, each
// step runs the next denoising step of every running request on the same expert in one
// transformer call (each block visits the device once for all of them), and a request leaves
// when its own schedule ends. Where forwards may overlap (resident weights), its VAE decode runs
// on the request's thread beside the loop; otherwise in the loop, between two steps.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "worker/diffusers/diffusion_stage_common.h"
#include "worker/runtime/engine_loop.h"
#include "worker/wan/payloads.h"
#include "worker/wan/stages.h"
#include "worker/wan/wan_stage_base.h"

namespace omni::pipeline::local {
namespace {

struct DiffusionSequence : EngineSequence {
  models::WanRequest request;
  std::optional<models::WanDenoising> state;  // from admission to the last step
  at::Tensor latents;                         // the final latents, to decode beside the loop
  Clock::time_point start;                    // admission
  StepClock clock;
  int64_t waiting_steps = 0;  // steps run without it since its last one (select's fairness)
  bool done = false;
};

class DiffusionStage : public WanStageBase, private EngineModel {
 public:
  explicit DiffusionStage(const LocalStageOptions& o)
      : WanStageBase(o, "diffusion"), decode_beside_loop_(backend_->forwards_may_overlap()) {
    EngineModel& model = *this;
    EngineLimits limits = o.limits;
    limits.chunked_prefill = false;  // no prompt tokens to schedule
    loop_ = std::make_unique<EngineLoop>(name_, model, limits);
  }
  ~DiffusionStage() override { loop_.reset(); }  // the loop stops before the model it steps

  // An entry stage: it reads the request, not `input`.
  void run(const StageCall& call, PacketQueue& /*input*/, const PacketSink& sink,
           const CancelToken& cancel) override {
    auto seq = std::make_shared<DiffusionSequence>();
    seq->request = read_request(call);
    seq->deadline = call.deadline;
    check_going(call, cancel);
    loop_->submit(seq);
    try {
      while (auto packet = seq->out.pop(&cancel)) sink(std::move(*packet));
    } catch (...) {
      seq->cancel();  // the client went away or the request failed: it leaves the batch
      loop_->wake();
      throw;
    }
    if (!seq->latents.defined()) return;  // decoded in the loop
    check_going(call, cancel);
    const auto decode_start = Clock::now();
    at::Tensor frames;
    translate_errors([&] {
      c10::InferenceMode inference;
      // The VAE keeps its causal cache in the module: one decode at a time.
      std::lock_guard<std::mutex> lock(decode_mutex_);
      auto scope = backend_->overlapping_scope();
      frames = pipe_->decode_latents(seq->latents);
    });
    sink(last_packet(*seq, frames, ms_since(decode_start)));
  }

 private:
  // The offload figures (as of the last moment no step ran) and the loop's under "engine".
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    all["engine"] = engine_stats(*loop_);
    return all.dump();
  }

  StagePacket last_packet(const DiffusionSequence& seq, const at::Tensor& frames,
                          double decode_ms) const {
    StagePacket done;
    done.finished = true;
    done.finish_reason = "stop";
    auto out = std::make_shared<VideoFrames>();
    out->frames = cpu(frames.to(at::kFloat));
    done.payload = std::move(out);
    const double steps = static_cast<double>(seq.request.num_inference_steps);
    done.metrics = {
        {"load_ms", load_ms_},    {"generate_ms", ms_since(seq.start)},
        {"steps", steps},         {"step_ms_mean", steps > 0 ? seq.clock.steps_ms / steps : 0.0},
        {"decode_ms", decode_ms}, {"fps", static_cast<double>(fps_)}};
    return done;
  }

  // ---- EngineModel: called on the loop's thread.
  int64_t prompt_tokens(const EngineSequence&) override { return 0; }

  // Joins the batch at a step boundary: its prompt encoded, its noise drawn.
  bool admit(EngineSequence& base) override {
    auto& seq = static_cast<DiffusionSequence&>(base);
    seq.start = Clock::now();
    const auto device = engine_->compute_device();
    run_model([&] {
      const auto conditioning = pipe_->encode(seq.request, device);
      seq.state = pipe_->start_denoise(seq.request, conditioning, device);
    });
    seq.clock.last = Clock::now();
    return true;
  }

  // The ready requests on one expert: that of the request that waited longest (the oldest on
  // a tie), so requests on the other expert take turns instead of waiting for the batch to end.
  std::vector<EngineSequence*> select(std::vector<EngineSequence*> ready) override {
    const auto as_seq = [](EngineSequence* s) { return static_cast<DiffusionSequence*>(s); };
    const DiffusionSequence* first = as_seq(ready.front());
    for (auto* s : ready) {
      if (as_seq(s)->waiting_steps > first->waiting_steps) first = as_seq(s);
    }
    const int expert = first->state->expert();
    std::vector<EngineSequence*> batch;
    for (auto* s : ready) {
      auto* seq = as_seq(s);
      if (seq->state->expert() == expert) {
        seq->waiting_steps = 0;
        batch.push_back(s);
      } else {
        ++seq->waiting_steps;
      }
    }
    return batch;
  }

  void step(const std::vector<EngineSequence*>& batch) override {
    std::vector<models::WanDenoising*> states;
    for (auto* base : batch) states.push_back(&*static_cast<DiffusionSequence&>(*base).state);
    std::vector<models::WanStep> steps;
    run_model([&] { steps = pipe_->denoise_step(states); });
    for (size_t k = 0; k < batch.size(); ++k) {
      auto& seq = static_cast<DiffusionSequence&>(*batch[k]);
      const double step_ms = ms_since(seq.clock.last);
      seq.clock.last = Clock::now();
      seq.clock.steps_ms += step_ms;
      seq.out.push(
          diffusion_step_packet(steps[k].index, steps[k].total, steps[k].timestep, step_ms));
      if (seq.state->done()) finish(seq);
    }
  }

  // The request's schedule ended: its latents go to the request's thread, or are decoded here.
  void finish(DiffusionSequence& seq) {
    const auto latents = pipe_->finish_denoise(*seq.state);
    seq.state.reset();
    seq.done = true;
    if (decode_beside_loop_) {
      seq.latents = latents;
      return;
    }
    const auto decode_start = Clock::now();
    at::Tensor frames;
    run_model([&] { frames = pipe_->decode_latents(latents); });
    seq.out.push(last_packet(seq, frames, ms_since(decode_start)));
  }

  bool finished(const EngineSequence& seq) override {
    return static_cast<const DiffusionSequence&>(seq).done;
  }
  void release(EngineSequence& base) override {
    static_cast<DiffusionSequence&>(base).state.reset();
  }

  const bool decode_beside_loop_;
  std::mutex decode_mutex_;  // decodes beside the loop
  std::unique_ptr<EngineLoop> loop_;
};

}  // namespace

std::unique_ptr<Stage> make_diffusion_stage(const LocalStageOptions& options) {
  return std::make_unique<DiffusionStage>(options);
}

}  // namespace omni::pipeline::local
