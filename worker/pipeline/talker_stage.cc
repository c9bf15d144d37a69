// The talker stage: the thinker's rows in, codec frames out as the talker speaks.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <optional>

#include "cpu_offload/logging.h"
#include "model_runner/runner/speech_runners.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/pipeline/stage_params.h"

namespace omni::pipeline::local {
namespace {

// Adds one of the thinker's packets to the streaming hand-off.
void add_packet(models::TalkerRunner::StreamingHandoff& h, const StagePacket& p) {
  for (const auto& t : p.tokens) h.handoff.generated.push_back(t);
  at::Tensor embeds, hidden;
  for (const auto& [name, t] : p.tensors) {
    if (name == "prompt_ids") {
      h.handoff.prompt_ids = ids_from(t);
    } else if (name == "tts_embeds") {
      h.handoff.tts_embeds = t;
    } else if (name == "stop_tokens") {
      h.thinker_stop_tokens = ids_from(t);
    } else if (name == "image_grids") {
      const auto g = ids_from(t);
      for (size_t i = 0; i + 2 < g.size(); i += 3)
        h.image_grids.push_back({g[i], g[i + 1], g[i + 2]});
    } else if (name == "embeds") {
      embeds = t;
    } else if (name == "hidden") {
      hidden = t;
    }
  }
  if (embeds.defined() || hidden.defined()) {
    OMNI_CHECK(embeds.defined() && hidden.defined(),
               "a thinker packet carries embeds without hidden rows or the reverse");
    h.append_rows(embeds, hidden);
  }
  if (p.finished) {
    h.finished = true;
    h.finish_reason = p.finish_reason;
  }
}

class TalkerStage : public LocalStageBase {
 public:
  explicit TalkerStage(const LocalStageOptions& o) : LocalStageBase(o) {
    models::SpeechRunnerOptions ro{o.model_dir, o.dtype, o.offload};
    if (o.offload_stage) {
      ro.offload = whole_stage_offload(o.offload.pin_memory);
      ro.offload.components = {"talker.*"};
    }
    runner_ = models::TalkerRunner::load(ro, engine_);
    batcher_ = std::make_unique<models::TalkerBatcher>(runner_->model(), runner_->offload(), mutex_,
                                                       o.limits.max_num_seqs);
  }

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "talker";
    i.speakers = runner_->speakers();
    i.default_speaker = runner_->default_speaker();
    i.num_code_groups = runner_->num_code_groups();
    return with_bytes(std::move(i));
  }

  // The talker starts as soon as the thinker's first tokens and rows are in, and reads the
  // rest while it speaks (TalkerRunner::generate_streaming). Concurrent requests step together
  // (TalkerBatcher): each model call takes the stage's lock, not the whole request.
  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;  // for the whole request: no autograd bookkeeping per op
    const auto params_ptr = params_as<TalkerParams>(call, talker_params);
    const TalkerParams& params = *params_ptr;
    check_going(call, cancel);
    translate_errors([&] { generate(call, params, input, sink, cancel); });
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }

 private:
  void generate(const StageCall& call, const TalkerParams& params, PacketQueue& input,
                const PacketSink& sink, const CancelToken& cancel) {
    models::TalkerRunner::StreamingHandoff h;
    const auto pull = [&] {
      auto packet = input.pop(&cancel);
      if (!packet) return false;
      add_packet(h, *packet);
      return true;
    };
    models::TalkerRunner::Request request;
    request.speaker = params.speaker;
    request.talker = params.talker;
    request.code_predictor = params.code_predictor;
    request.max_frames = params.max_frames;
    const auto run = runner_->generate_streaming(
        h, pull, request,
        [&](const std::vector<int64_t>& frame) {
          check_going(call, cancel);
          StagePacket packet;
          packet.frames = {frame};
          sink(std::move(packet));
          return true;
        },
        batcher_.get());
    // Whatever the thinker still sends after the last frame (its last rows, its end).
    while (!h.finished && pull()) {
    }
    StagePacket last;
    last.finished = true;
    last.finish_reason = run.finish_reason;
    last.metrics = {{"talker_ms", run.talker_ms},
                    {"code_predictor_ms", run.code_predictor_ms},
                    {"frames", static_cast<double>(run.frames.size())}};
    if (!run.frames.empty() && run.talker_ms > 0) {
      last.metrics["frames_per_s"] =
          static_cast<double>(run.frames.size()) / (run.talker_ms / 1000.0);
    }
    sink(std::move(last));
  }

  // The offload figures (as of the last moment no step ran) and "engine": the batching's, live.
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    all["engine"] = batching_stats(batcher_->stats());
    return all.dump();
  }

  std::unique_ptr<models::TalkerRunner> runner_;
  std::unique_ptr<models::TalkerBatcher> batcher_;
};

}  // namespace

std::unique_ptr<Stage> make_talker_stage(const LocalStageOptions& options) {
  return std::make_unique<TalkerStage>(options);
}

}  // namespace omni::pipeline::local
