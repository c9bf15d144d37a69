// The thinker stage: the prompt in, text out (streamed), and for a talker downstream the
// hidden rows it needs, packet by packet.
#include <ATen/ATen.h>

#include <optional>

#include "cpu_offload/logging.h"
#include "cpu_offload/stats_report.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/tokenizer/text_stream.h"
#include "model_runner/weights/hf_config.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/pipeline/stage_params.h"
#include "worker/pipeline/stop_strings.h"

namespace omni::pipeline::local {
namespace {

class ThinkerStage : public LocalStageBase {
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
  }

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "thinker";
    i.speech = capture_layer_ >= 0;
    return with_bytes(std::move(i));
  }

  void run(const StageCall& call, PacketQueue&, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params_ptr = params_as<ThinkerParams>(call, thinker_params);
    const ThinkerParams& params = *params_ptr;
    std::lock_guard<std::mutex> lock(mutex_);
    auto forward = backend().forward_scope();
    check_going(call, cancel);
    translate_errors([&] { generate(call, params, sink, cancel); });
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
  uint64_t extra_device_bytes() override {
    auto* experts = runner_->expert_cache();
    return experts == nullptr ? 0 : experts->stats().device_bytes;
  }
  uint64_t device_bytes() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return backend().stats().current_device_bytes + extra_device_bytes();
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
    Json& e = all["expert_cache"];
    e["tokens"] = tokens_;
    e["bytes_h2d_per_token"] =
        tokens_ > 0 ? static_cast<double>(e["bytes_h2d"].get<uint64_t>()) / tokens_ : 0.0;
    return all.dump();
  }

 private:
  void generate(const StageCall& call, const ThinkerParams& params, const PacketSink& sink,
                const CancelToken& cancel) {
    at::NoGradGuard no_grad;
    OMNI_CHECK(!params.handoff || capture_layer_ >= 0,
               "speech was asked for but the checkpoint has no talker");
    models::ChatRequest chat;
    chat.text = params.text;
    chat.system_prompt = params.system_prompt;
    chat.history = params.history;
    chat.parts = params.parts;
    // The media go to the preprocessor as the bytes the call carries.
    for (const MediaFile& m : call.media) {
      (m.kind == "image" ? chat.image_files : chat.audio_files)
          .push_back(models::ChatMedia::in_memory(m.name, m.data));
    }
    const auto inputs = runner_->prepare(chat);
    auto sampling = params.sampling;
    if (sampling.stop_token_ids.empty()) sampling.stop_token_ids = runner_->default_stop_tokens();

    auto& thinker = runner_->model();
    auto state = thinker.new_state(params.handoff ? capture_layer_ : -1);
    models::TextStreamDecoder decoder(runner_->tokenizer());
    StopStringCutter stop(params.stop);
    size_t rows_sent = 0;
    bool first = true;
    const auto start = Clock::now();
    double prefill_ms = 0;
    check_going(call, cancel);
    const auto result = runner_->generate(
        inputs, sampling,
        [&](int64_t token) {
          if (first) prefill_ms = ms_since(start);  // the prompt's forward and one sample
          StagePacket packet;
          packet.tokens = {token};
          packet.text = stop.push(decoder.push(token));
          if (params.handoff) {
            if (first) {
              packet.tensors.emplace_back("prompt_ids", ids_tensor(inputs.input_ids));
              packet.tensors.emplace_back("tts_embeds", cpu(thinker.embed(tts_ids_)));
              packet.tensors.emplace_back("stop_tokens", ids_tensor(sampling.stop_token_ids));
              std::vector<int64_t> grids;
              for (const auto& g : inputs.image_grids)
                grids.insert(grids.end(), g.begin(), g.end());
              packet.tensors.emplace_back(
                  "image_grids",
                  ids_tensor(grids).reshape({static_cast<int64_t>(inputs.image_grids.size()), 3}));
            }
            // The rows the last forward appended (the prompt's, then the fed-back token's).
            std::vector<at::Tensor> embeds, hidden;
            for (; rows_sent < state.embeds.size(); ++rows_sent) {
              embeds.push_back(state.embeds[rows_sent]);
              hidden.push_back(state.hidden[rows_sent]);
            }
            if (!embeds.empty()) {
              packet.tensors.emplace_back("embeds", cpu(at::cat(embeds, 0)));
              packet.tensors.emplace_back("hidden", cpu(at::cat(hidden, 0)));
            }
          }
          first = false;
          sink(std::move(packet));
          check_going(call, cancel);
          return !stop.stopped();  // a stop string ends the answer like a stop token
        },
        &state);
    tokens_ += result.tokens.size();
    StagePacket last;
    last.finished = true;
    last.text = stop.stopped() ? "" : stop.push(decoder.finish());
    last.text += stop.finish();
    last.finish_reason = stop.stopped() ? "stop" : result.finish_reason;
    const double total_ms = ms_since(start);
    last.metrics = {{"prefill_ms", prefill_ms},
                    {"total_ms", total_ms},
                    {"prompt_tokens", static_cast<double>(inputs.input_ids.size())},
                    {"tokens", static_cast<double>(result.tokens.size())}};
    if (result.tokens.size() > 1 && total_ms > prefill_ms) {
      last.metrics["decode_tokens_per_s"] =
          static_cast<double>(result.tokens.size() - 1) / ((total_ms - prefill_ms) / 1000.0);
    }
    sink(std::move(last));
  }

  std::unique_ptr<models::ThinkerRunner> runner_;
  uint64_t tokens_ = 0;  // generated since the stage loaded (under mutex_)
  int64_t capture_layer_ = -1;
  std::vector<int64_t> tts_ids_;
};

}  // namespace

std::unique_ptr<Stage> make_thinker_stage(const LocalStageOptions& options) {
  return std::make_unique<ThinkerStage>(options);
}

}  // namespace omni::pipeline::local
