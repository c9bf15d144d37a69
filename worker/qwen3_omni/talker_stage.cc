// The talker stage: the thinker's rows in, codec frames out as the talker speaks.
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "cpu_offload/logging.h"
#include "model_runner/qwen3_omni/text_model.h"
#include "model_runner/runner/speech_runners.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/qwen3_omni/payloads.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/qwen3_omni/stages.h"
#include "worker/runtime/engine_loop.h"
#include "worker/runtime/kv_manager.h"
#include "worker/runtime/streamed_sequence.h"

namespace omni::pipeline::local {
namespace {

// Adds one of the thinker's packets to the streaming hand-off.
void add_packet(models::TalkerRunner::StreamingHandoff& h, const StagePacket& p) {
  for (const auto& t : p.tokens) h.handoff.generated.push_back(t);
  if (const auto rows = payload_as<ThinkerRows>(p, &ThinkerRows::read)) {
    if (rows->first) {
      h.handoff.prompt_ids = rows->prompt_ids;
      h.handoff.tts_embeds = rows->tts_embeds;
      h.thinker_stop_tokens = rows->stop_tokens;
      h.image_grids = rows->image_grids;
    }
    if (rows->embeds.defined()) h.append_rows(rows->embeds, rows->hidden);
  }
  if (p.finished) {
    h.finished = true;
    h.finish_reason = p.finish_reason;
  }
}

// One request in the talker's engine loop: the thinker's packets come in as it speaks.
struct TalkerSequence : StreamedSequence {
  // The loop's thread only (the request's thread reads them once `out` is closed).
  std::unique_ptr<models::TalkerRunner::Session> session;  // until the loop releases it
  KvSequence kv;  // the session's KV cache, as the stage's KV manager sees it (from its prefill)
  int64_t max_frames = 0;
  models::qwen3_omni::TalkerRun result;  // the session's, at its release
  bool done = false;
  double talker_ms = 0;  // the prefill and the steps it took part in
};

class TalkerStage : public LocalStageBase, private EngineModel {
 public:
  explicit TalkerStage(const LocalStageOptions& o) : LocalStageBase(o) {
    models::SpeechRunnerOptions ro{o.model_dir, o.dtype, o.offload};
    if (o.offload_stage) {
      ro.offload = whole_stage_offload(o.offload.pin_memory);
      ro.offload.components = {"talker.*"};
    }
    runner_ = models::TalkerRunner::load(ro, engine_);
    const auto& talker = runner_->model();
    kv_ = std::make_unique<KvManager>(
        models::qwen3_omni::kv_pool_shape(talker.config().text, talker.dtype(), talker.device(),
                                          std::max<int64_t>(1, o.kv_block_size), 0),
        o.kv_cache_memory_bytes, name_);
    kv_->publish();
    EngineModel& model = *this;
    // Its prompt runs whole in admit(): chunked prefill is the thinker's.
    EngineLimits limits = o.limits;
    limits.chunked_prefill = false;
    loop_ = std::make_unique<EngineLoop>(name_, model, limits);
  }
  ~TalkerStage() override { loop_.reset(); }  // before the model it steps

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "talker";
    i.voices = runner_->speakers();
    i.default_voice = runner_->default_speaker();
    i.family_json = talker_facts_json(TalkerFacts{runner_->num_code_groups()});
    return with_bytes(std::move(i));
  }

  // The talker starts as soon as the thinker's first tokens and rows are in and reads the rest
  // while it speaks (TalkerRunner::Session). The engine loop steps every request that has its
  // next text row in one batch; this thread forwards the thinker's packets to it and the
  // frames it makes to `sink`.
  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = params_as<TalkerParams>(call, talker_params);
    check_going(call, cancel);
    auto seq = std::make_shared<TalkerSequence>();
    models::TalkerRunner::Request request;
    request.speaker = params->speaker;
    request.talker = params->talker;
    request.code_predictor = params->code_predictor;
    request.max_frames = params->max_frames;
    seq->session = runner_->start_session(request);
    seq->max_frames = request.max_frames;
    // Its KV cache joins the stage's pool at its prefill, once the blocks of its longest run
    // (prompt and every frame) are free: a talker sequence is never preempted (it could not
    // recompute its frames), it waits. Called on the loop's thread, with mutex_ held.
    seq->session->before_prefill = [this, s = seq.get()](models::qwen3_omni::TalkerState& state,
                                                         int64_t prompt_tokens) {
      s->kv.cache = &state.cache;
      kv_->attach(state.cache);
      const bool admitted = kv_->admit_worst_case(s->kv, prompt_tokens, s->max_frames + 1);
      kv_->publish();
      return admitted;
    };
    seq->deadline = call.deadline;
    run_streamed({{loop_.get(), seq}}, input, sink, cancel);
    const auto& run = seq->result;
    StagePacket last;
    last.finished = true;
    last.finish_reason = run.finish_reason;
    last.metrics = {{"talker_ms", seq->talker_ms},
                    {"code_predictor_ms", run.code_predictor_ms},
                    {"frames", static_cast<double>(run.frames.size())}};
    if (!run.frames.empty() && seq->talker_ms > 0) {
      last.metrics["frames_per_s"] =
          static_cast<double>(run.frames.size()) / (seq->talker_ms / 1000.0);
    }
    sink(std::move(last));
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }

 private:
  // The offload figures (as of the last moment no step ran) and "engine": the loop's, live.
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    all["engine"] = engine_stats(*loop_);
    all["engine"].update(kv_stats(kv_->published()));
    return all.dump();
  }

  // ---- EngineModel: called on the loop's thread.
  int64_t prompt_tokens(const EngineSequence&) override { return 0; }  // known at prefill only
  bool admit(EngineSequence&) override { return true; }  // the prefill waits for the thinker

  // Moves the thinker's packets in, then prefills or adds the next text row if they allow.
  bool ready(EngineSequence& base) override {
    auto& seq = static_cast<TalkerSequence&>(base);
    auto& session = *seq.session;
    bool ended = false;
    for (const auto& packet : seq.take_input(&ended)) add_packet(session.h, packet);
    if (ended) session.h.finished = true;
    using Next = models::TalkerRunner::Session::Next;
    Next next = Next::kInput;
    const auto start = Clock::now();
    run_model([&] { next = session.advance(); });
    seq.talker_ms += ms_since(start);
    seq.done = next == Next::kDone;
    return next == Next::kStep;
  }

  void step(const std::vector<EngineSequence*>& batch) override {
    std::vector<int64_t> codes;
    std::vector<models::qwen3_omni::TalkerState*> states;
    std::vector<models::Sampler*> samplers;
    for (auto* base : batch) {
      auto& session = *static_cast<TalkerSequence&>(*base).session;
      codes.push_back(session.decode().code());
      states.push_back(&session.state());
      samplers.push_back(&session.decode().code_predictor_sampler());
    }
    const auto start = Clock::now();
    at::Tensor logits;
    std::vector<std::vector<int64_t>> frames;
    run_model([&] { frames = runner_->model().step_batch(codes, states, samplers, logits); });
    const double took = ms_since(start);
    std::vector<models::qwen3_omni::TalkerDecode*> decodes;
    for (auto* base : batch)
      decodes.push_back(&static_cast<TalkerSequence&>(*base).session->decode());
    models::qwen3_omni::TalkerDecode::stepped_batch(decodes, frames, logits);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& seq = static_cast<TalkerSequence&>(*batch[i]);
      seq.talker_ms += took;
      StagePacket packet;
      packet.frames = {std::move(frames[i])};
      seq.out.push(std::move(packet));
      seq.done = decodes[i]->done();
    }
  }

  bool finished(const EngineSequence& seq) override {
    return static_cast<const TalkerSequence&>(seq).done;
  }

  // The session's KV cache goes now; its frames and figures stay for the request's thread.
  void release(EngineSequence& base) override {
    auto& seq = static_cast<TalkerSequence&>(base);
    seq.result = seq.session->run();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      kv_->release(seq.kv);
      kv_->publish();
    }
    seq.session.reset();
  }

  std::unique_ptr<models::TalkerRunner> runner_;
  std::unique_ptr<EngineLoop> loop_;  // last: stopped before the rest goes
};

}  // namespace

std::unique_ptr<Stage> make_talker_stage(const LocalStageOptions& options) {
  return std::make_unique<TalkerStage>(options);
}

}  // namespace omni::pipeline::local
