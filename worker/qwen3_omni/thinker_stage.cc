// The thinker stage: the prompt in, text out (streamed), and for a talker downstream the
// hidden rows it needs, packet by packet.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "cpu_offload/logging.h"
#include "cpu_offload/stats_report.h"
#include "model_runner/generation/token_sequence.h"
#include "model_runner/kv/kv_block_pool.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/tokenizer/text_stream.h"
#include "model_runner/weights/hf_config.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/pipeline/stop_strings.h"
#include "worker/qwen3_omni/payloads.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/qwen3_omni/stages.h"
#include "worker/runtime/engine_loop.h"
#include "worker/runtime/kv_manager.h"

namespace omni::pipeline::local {
namespace {

namespace qwen3_omni = models::qwen3_omni;

// One request in the thinker's engine loop.
struct ThinkerSequence : EngineSequence {
  ThinkerSequence(std::shared_ptr<const ThinkerParams> p, qwen3_omni::ThinkerInputs in,
                  const models::SamplingParams& sampling, qwen3_omni::ThinkerState s,
                  const models::Tokenizer& tokenizer)
      : params(std::move(p)),
        inputs(std::move(in)),
        tokens(sampling, inputs.input_ids),
        state(std::move(s)),
        decoder(tokenizer),
        stop(params->stop) {}
  std::shared_ptr<const ThinkerParams> params;
  qwen3_omni::ThinkerInputs inputs;
  models::TokenSequence tokens;
  qwen3_omni::ThinkerState state;
  models::TextStreamDecoder decoder;
  StopStringCutter stop;
  // The prompt admit() prepared, while prefill() has rows of it to run.
  std::optional<qwen3_omni::PromptChunks> prompt;
  at::Tensor next_logits;     // of the last forward, for the next sample
  size_t rows_sent = 0;       // hand-off rows already in packets
  KvSequence kv;              // its KV blocks, as the stage's KV manager sees them
  bool done = false;          // the finished packet is out
  Clock::time_point start{};  // admission
  double prefill_ms = 0;
};

class ThinkerStage : public LocalStageBase, private EngineModel {
 public:
  explicit ThinkerStage(const LocalStageOptions& o) : LocalStageBase(o) {
    models::ThinkerRunnerOptions ro;
    ro.model_dir = o.model_dir;
    ro.dtype = o.dtype;
    ro.offload = o.offload;
    ro.offload.components = models::thinker_stage_component_names(o.offload.components);
    if (ro.offload.components.empty()) ro.offload.cpu_offload_enabled = false;
    if (o.offload_stage) {
      if (o.offload.cpu_offload_experts || o.offload.host_memory_budget_bytes > 0) {
        log_warning(name_,
                    ": offload_stage moves the whole stage on and off the device as one "
                    "component; its cpu_offload_experts and host_memory_budget are ignored");
      }
      ro.offload = whole_stage_offload(o.offload.pin_memory);
    }
    runner_ = models::ThinkerRunner::load(ro, engine_);
    const auto config = models::HfConfig::load(o.model_dir);
    if (models::qwen3_omni::has_speech_output(config)) {
      const auto thinker = models::qwen3_omni::parse_thinker_config(config);
      const auto talker = models::qwen3_omni::parse_talker_config(config, thinker);
      const auto ids = models::qwen3_omni::parse_omni_token_ids(config, thinker);
      capture_layer_ = talker.accept_hidden_layer;
      tts_ids_ = {ids.tts_bos, ids.tts_eos, ids.tts_pad};
    }
    const auto& text = runner_->model().config().text;
    kv_ = std::make_unique<KvManager>(
        qwen3_omni::kv_pool_shape(text, runner_->dtype(), runner_->model().device(),
                                  std::max<int64_t>(1, o.kv_block_size), 0),
        o.kv_cache_memory_bytes, name_);
    kv_->publish();
    EngineModel& model = *this;
    loop_ = std::make_unique<EngineLoop>(name_, model, o.limits);
  }
  ~ThinkerStage() override { loop_.reset(); }  // before the model it steps

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "thinker";
    // The prompt must stay below the context (token_sequence.h); the text that could fit it is
    // what a server lets through before tokenizing.
    const int64_t context = runner_->model().config().text.max_position_embeddings;
    if (context > 0) {
      i.context_tokens = context;
      i.max_prompt_bytes = static_cast<uint64_t>(
          runner_->tokenizer().max_text_bytes(static_cast<size_t>(context - 1)).value_or(0));
    }
    return with_bytes(std::move(i));
  }

  // Prepares the request on the caller's thread (chat template, media decoding, features),
  // queues it in the engine loop, and streams what the loop emits for it into `sink`.
  void run(const StageCall& call, PacketQueue&, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = params_as<ThinkerParams>(call, thinker_params);
    check_going(call, cancel);
    std::shared_ptr<ThinkerSequence> seq;
    translate_errors([&] { seq = make_sequence(call, params); });
    loop_->submit(seq);
    try {
      while (auto packet = seq->out.pop(&cancel)) sink(std::move(*packet));
    } catch (...) {
      seq->cancel();  // the client went away or the request failed: free its KV at once
      throw;
    }
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }
  uint64_t weight_bytes_kept_off_device() override {
    const auto* experts = runner_->expert_cache();
    if (experts == nullptr) return 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < experts->size(); ++k) {
      for (const auto& t : experts->unit(static_cast<int>(k)).tensors()) bytes += t.nbytes;
    }
    return bytes;
  }
  // What the device ledger counts beside the weights and the KV pool: the expert cache's slots.
  uint64_t extra_device_bytes() override { return expert_device_bytes(); }
  // The offload backend's figures (as of the last moment no step ran), and "engine": the
  // batching loop's, live (running, waiting, steps, batch sizes, queue time) with its KV blocks
  // (used: held now; reserved: what the running requests would hold at their longest, prompt
  // plus max_new_tokens: a figure of demand, admission goes by the blocks in use).
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    const auto e = loop_->stats();
    all["engine"] = engine_stats(*loop_);
    all["engine"].update(kv_stats(kv_->published()));
    all["engine"]["tokens"] = tokens_.load();
    // Offload with batches: the weight bytes copied per generated token and per forward (a
    // decode step of the batch, or a prompt or a chunk of one).
    if (all.contains("bytes_h2d")) {
      const double bytes = all["bytes_h2d"].get<double>();
      const int64_t forwards = e.steps + e.prefill_chunks;
      all["engine"]["bytes_h2d_per_token"] = tokens_ > 0 ? bytes / tokens_.load() : 0.0;
      all["engine"]["bytes_h2d_per_forward"] = forwards > 0 ? bytes / forwards : 0.0;
    }
    return all.dump();
  }
  // With cpu_offload_experts, the device expert cache's figures under "expert_cache" (hits,
  // misses, host_computed, prefetched, loads, bytes_h2d, stall_ms, hit_rate, ...; see
  // ExpertCacheStats), with the tokens this stage generated since it loaded and the expert
  // bytes copied per token (prefill and decode together). Under a host memory budget, the disk
  // tiers' figures (DiskTierStats): the layers' under "disk", the experts' under
  // "expert_cache.disk".
  std::string idle_stats_json() override {
    std::string report = offload::offload_report_json(backend(), runner_->expert_cache());
    if (runner_->expert_cache() == nullptr) return report;
    Json all = Json::parse(report);
    Json& x = all["expert_cache"];
    const uint64_t tokens = tokens_;
    x["tokens"] = tokens;
    x["bytes_h2d_per_token"] =
        tokens > 0 ? static_cast<double>(x["bytes_h2d"].get<uint64_t>()) / tokens : 0.0;
    return all.dump();
  }

 private:
  uint64_t expert_device_bytes() {
    auto* experts = runner_->expert_cache();
    return experts == nullptr ? 0 : experts->stats().device_bytes;
  }

  std::shared_ptr<ThinkerSequence> make_sequence(const StageCall& call,
                                                 std::shared_ptr<const ThinkerParams> params) {
    OMNI_CHECK(!params->handoff || capture_layer_ >= 0,
               "speech was asked for but the checkpoint has no talker");
    models::ChatRequest chat;
    chat.text = params->text;
    chat.system_prompt = params->system_prompt;
    chat.history = params->history;
    chat.parts = params->parts;
    // The media go to the preprocessor as the bytes the call carries.
    for (const MediaFile& m : call.media) {
      (m.kind == "image" ? chat.image_files : chat.audio_files)
          .push_back(models::ChatMedia::in_memory(m.name, m.data));
    }
    auto inputs = runner_->prepare(chat);
    auto sampling = params->sampling;
    if (sampling.stop_token_ids.empty()) sampling.stop_token_ids = runner_->default_stop_tokens();
    sampling.max_context = runner_->model().config().text.max_position_embeddings;
    auto state = runner_->model().new_state(params->handoff ? capture_layer_ : -1);
    kv_->attach(state.cache);
    auto seq = std::make_shared<ThinkerSequence>(std::move(params), std::move(inputs), sampling,
                                                 std::move(state), runner_->tokenizer());
    seq->kv.cache = &seq->state.cache;
    seq->deadline = call.deadline;
    return seq;
  }

  // ---- EngineModel: called on the loop's thread.
  int64_t prompt_tokens(const EngineSequence& seq) override {
    return static_cast<int64_t>(static_cast<const ThinkerSequence&>(seq).inputs.input_ids.size());
  }

  bool admit(EngineSequence& base) override {
    auto& seq = static_cast<ThinkerSequence&>(base);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kv_->admit(seq.kv, prompt_tokens(seq), seq.tokens.params().max_new_tokens)) return false;
    seq.start = Clock::now();
    translate_errors([&] {
      c10::InferenceMode inference;  // no autograd bookkeeping per op
      auto forward = backend().forward_scope();
      if (seq.tokens.finished()) return finish(seq);  // max_new_tokens 0
      // The encoders run now; the decoder takes the prompt in prefill(), whole or in chunks.
      seq.prompt = runner_->model().prepare_prompt(seq.inputs, seq.state);
    });
    kv_->publish();
    return true;
  }

  int64_t prefill_remaining(const EngineSequence& base) override {
    const auto& seq = static_cast<const ThinkerSequence&>(base);
    return seq.prompt ? seq.prompt->remaining() : 0;
  }

  void prefill(EngineSequence& base, int64_t max_tokens) override {
    auto& seq = static_cast<ThinkerSequence&>(base);
    std::lock_guard<std::mutex> lock(mutex_);
    translate_errors([&] {
      c10::InferenceMode inference;  // no autograd bookkeeping per op
      auto forward = backend().forward_scope();
      const auto logits = runner_->model().prefill_chunk(*seq.prompt, seq.state, max_tokens);
      if (seq.prompt->remaining() > 0) return;
      seq.prompt.reset();
      kv_->prompt_done(seq.kv);
      seq.next_logits = logits[0];
      sample(seq);
    });
    kv_->publish();
  }

  // A preempted sequence sits out until the pool has the blocks for what it had cached and its
  // next token; then its prompt and the tokens it generated are prefilled again (nothing is
  // sampled: the next step feeds its last token as if it had never left).
  bool ready(EngineSequence& base) override {
    auto& seq = static_cast<ThinkerSequence&>(base);
    if (!seq.kv.preempted) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& generated = seq.tokens.tokens();
    auto inputs = seq.inputs;
    inputs.input_ids.insert(inputs.input_ids.end(), generated.begin(), generated.end() - 1);
    if (!kv_->can_resume(seq.kv, static_cast<int64_t>(inputs.input_ids.size()))) return false;
    translate_errors([&] {
      c10::InferenceMode inference;  // no autograd bookkeeping per op
      auto forward = backend().forward_scope();
      // The rows a talker reads were sent already: none again.
      const int64_t capture = seq.state.capture_layer;
      seq.state.capture_layer = -1;
      runner_->model().prefill(inputs, seq.state);
      seq.state.capture_layer = capture;
    });
    kv_->resumed(seq.kv);
    kv_->publish();
    return true;
  }

  void step(const std::vector<EngineSequence*>& batch) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<KvSequence*> kv_rows;
    for (auto* base : batch) kv_rows.push_back(&static_cast<ThinkerSequence*>(base)->kv);
    kv_->make_room(kv_rows);  // the rows that do not fit leave the step, preempted
    std::vector<ThinkerSequence*> rows;
    for (auto* base : batch) {
      auto* seq = static_cast<ThinkerSequence*>(base);
      if (!seq->kv.preempted) rows.push_back(seq);
    }
    std::vector<int64_t> tokens;
    std::vector<qwen3_omni::ThinkerState*> states;
    for (auto* seq : rows) {
      tokens.push_back(seq->tokens.tokens().back());
      states.push_back(&seq->state);
    }
    if (!rows.empty()) {
      translate_errors([&] {
        c10::InferenceMode inference;  // no autograd bookkeeping per op
        auto forward = backend().forward_scope();
        const auto logits = runner_->model().decode_batch(tokens, states);
        for (size_t i = 0; i < rows.size(); ++i) {
          rows[i]->next_logits = logits[static_cast<int64_t>(i)];
          sample(*rows[i]);
        }
      });
    }
    kv_->publish();
  }

  bool finished(const EngineSequence& seq) override {
    return static_cast<const ThinkerSequence&>(seq).done;
  }

  void release(EngineSequence& base) override {
    auto& seq = static_cast<ThinkerSequence&>(base);
    std::lock_guard<std::mutex> lock(mutex_);
    kv_->release(seq.kv);
    seq.state.embeds.clear();
    seq.state.hidden.clear();
    seq.prompt.reset();
    kv_->publish();
  }

  // Samples the sequence's next token from its last forward and emits it (with mutex_ held).
  void sample(ThinkerSequence& seq) {
    const int64_t token = seq.tokens.sample(seq.next_logits);
    ++tokens_;
    const bool first = seq.tokens.tokens().size() == 1;
    if (first) seq.prefill_ms = ms_since(seq.start);  // the prompt's forward and one sample
    const auto& params = *seq.params;
    StagePacket packet;
    packet.tokens = {token};
    packet.text = seq.stop.push(seq.decoder.push(token));
    if (params.handoff) {
      auto rows = std::make_shared<ThinkerRows>();
      if (first) {
        rows->first = true;
        rows->prompt_ids = seq.inputs.input_ids;
        rows->tts_embeds = cpu(runner_->model().embed(tts_ids_));
        rows->stop_tokens = seq.tokens.params().stop_token_ids;
        rows->image_grids = seq.inputs.image_grids;
      }
      // The rows the last forward appended (the prompt's, then the fed-back token's).
      std::vector<at::Tensor> embeds, hidden;
      for (; seq.rows_sent < seq.state.embeds.size(); ++seq.rows_sent) {
        embeds.push_back(seq.state.embeds[seq.rows_sent]);
        hidden.push_back(seq.state.hidden[seq.rows_sent]);
      }
      if (!embeds.empty()) {
        rows->embeds = cpu(at::cat(embeds, 0));
        rows->hidden = cpu(at::cat(hidden, 0));
      }
      packet.payload = std::move(rows);
    }
    seq.out.push(std::move(packet));
    if (seq.stop.stopped()) seq.tokens.cancel();  // a stop string ends it like a stop token
    if (seq.tokens.finished()) finish(seq);
  }

  // The sequence's last packet.
  void finish(ThinkerSequence& seq) {
    const auto& generated = seq.tokens.tokens();
    StagePacket last;
    last.finished = true;
    last.text = seq.stop.stopped() ? "" : seq.stop.push(seq.decoder.finish());
    last.text += seq.stop.finish();
    last.finish_reason = seq.stop.stopped() ? "stop" : seq.tokens.finish_reason();
    const double total_ms = ms_since(seq.start);
    last.metrics = {{"prefill_ms", seq.prefill_ms},
                    {"total_ms", total_ms},
                    {"prompt_tokens", static_cast<double>(seq.inputs.input_ids.size())},
                    {"tokens", static_cast<double>(generated.size())}};
    if (generated.size() > 1 && total_ms > seq.prefill_ms) {
      last.metrics["decode_tokens_per_s"] =
          static_cast<double>(generated.size() - 1) / ((total_ms - seq.prefill_ms) / 1000.0);
    }
    seq.out.push(std::move(last));
    seq.done = true;
  }

  std::unique_ptr<models::ThinkerRunner> runner_;
  std::atomic<uint64_t> tokens_{0};  // generated since the stage loaded
  int64_t capture_layer_ = -1;
  std::vector<int64_t> tts_ids_;
  std::unique_ptr<EngineLoop> loop_;  // last: stopped before the rest goes
};

}  // namespace

std::unique_ptr<Stage> make_thinker_stage(const LocalStageOptions& options) {
  return std::make_unique<ThinkerStage>(options);
}

}  // namespace omni::pipeline::local
