#include "worker/pipeline/local_stages.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/stats_report.h"
#include "model_runner/generation/generate.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/tokenizer/text_stream.h"
#include "model_runner/weights/hf_config.h"
#include "worker/pipeline/stage_params.h"
#include "worker/pipeline/stop_strings.h"

namespace omni::pipeline {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Between two steps of a stage: stop when the request was cancelled or ran out of time.
void check_going(const StageCall& call, const CancelToken& cancel) {
  if (cancel.cancelled()) {
    throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
  }
  if (Clock::now() >= call.deadline) {
    throw StageError(StageError::Code::kDeadlineExceeded, "", "the request's deadline passed");
  }
}

at::Tensor cpu(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

at::Tensor ids_tensor(const std::vector<int64_t>& ids) { return at::tensor(ids, at::kLong); }

std::vector<int64_t> ids_from(const at::Tensor& t) {
  const auto c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::string offload_stats_json(offload::OffloadBackend& backend) {
  return backend.stats().to_json();
}

// offload_stage: every top-level part of the stage is a component, and the budget holds them
// all, so once loaded they stay until the ledger releases them.
models::RunnerOffloadOptions whole_stage_offload(bool pin_memory) {
  models::RunnerOffloadOptions o;
  o.cpu_offload_enabled = true;
  o.components = {"thinker.*"};
  o.strategy = "alternating";
  o.pin_memory = pin_memory;
  o.device_budget_bytes = size_t{1} << 62;
  return o;
}

// The request's media written to a private folder for the preprocessor (which reads files),
// removed when the request ends.
class MediaFolder {
 public:
  explicit MediaFolder(const std::vector<MediaFile>& media) {
    if (media.empty()) return;
    std::string pattern = (fs::temp_directory_path() / "omni-media-XXXXXX").string();
    OMNI_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a folder for the media in ",
               fs::temp_directory_path().string());
    dir_ = pattern;
    for (size_t i = 0; i < media.size(); ++i) {
      // Keep the name's extension: the decoders report formats by name.
      const auto name = fs::path(media[i].name).filename().string();
      const auto path = dir_ / (std::to_string(i) + "-" + (name.empty() ? "input" : name));
      std::ofstream out(path, std::ios::binary);
      out.write(media[i].data.data(), static_cast<std::streamsize>(media[i].data.size()));
      OMNI_CHECK(out.good(), "cannot write ", path.string());
      (media[i].kind == "image" ? images : audio).push_back(path.string());
    }
  }
  ~MediaFolder() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  std::vector<std::string> audio, images;

 private:
  fs::path dir_;
};

// Runs `fn`, turning the runner's errors into StageErrors: a bad request or checkpoint error
// (omni::Error, c10::Error) is invalid_argument unless it happened mid-generation.
template <typename Fn>
void translate_errors(Fn&& fn) {
  try {
    fn();
  } catch (const StageError&) {
    throw;
  } catch (const c10::Error& e) {
    throw StageError(StageError::Code::kInternal, "", e.what_without_backtrace());
  } catch (const omni::Error& e) {
    throw StageError(StageError::Code::kInvalidArgument, "", e.what());
  } catch (const std::exception& e) {
    throw StageError(StageError::Code::kInternal, "", e.what());
  }
}

// Common parts: the name, one request at a time (a runner's model and offload bindings are
// shared by its requests), the engine.
class LocalStageBase : public Stage {
 public:
  explicit LocalStageBase(const LocalStageOptions& o)
      : name_(o.name), engine_(offload::make_transfer_engine(o.device)) {}
  const std::string& name() const override { return name_; }
  // Only between requests: the stage's lock waits for a running one.
  uint64_t set_device_released(bool release) override {
    if (!release) return 0;  // the weights come back with the next forward
    std::lock_guard<std::mutex> lock(mutex_);
    return backend().release_device();
  }
  uint64_t device_bytes() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return backend().stats().current_device_bytes;
  }
  // Never waits for a running request (a /metrics scrape or the Stats RPC must answer at
  // once): while one runs, the figures taken when the stage was last idle.
  std::string stats_json() override {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    std::lock_guard<std::mutex> snapshot_lock(snapshot_mutex_);
    if (lock.owns_lock()) {
      snapshot_ = idle_stats_json();
    } else if (snapshot_.empty()) {
      return "{\"running\": true}";
    }
    return snapshot_;
  }

 protected:
  virtual offload::OffloadBackend& backend() = 0;
  // The stage's figures, taken with mutex_ held (no request running): the offload backend's.
  virtual std::string idle_stats_json() { return offload_stats_json(backend()); }
  // Weight bytes that never come to the device as such (with expert offload: the experts,
  // which only visit the expert cache), and device bytes the stage holds beside its backend's
  // (the expert cache's slots). Measured with mutex_ held.
  virtual uint64_t weight_bytes_kept_off_device() { return 0; }
  virtual uint64_t extra_device_bytes() { return 0; }
  // `info` plus the weight bytes: all of them, those that can leave the device, and those the
  // device ledger accounts for the stage when it is loaded (device_weight_bytes: all weights,
  // less the experts and plus the expert cache under expert offload).
  // (Measured once, when the first info is asked for, and kept: the bytes do not change, and
  // info must not wait for a running request.)
  std::string info_with_bytes(Json info) {
    std::call_once(bytes_measured_, [&] {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto stats = backend().stats();
      param_bytes_ = stats.param_bytes;
      // resident_bytes counts the alignment padding of its buffers, so it can pass param_bytes
      // when every weight is resident.
      offloadable_bytes_ =
          stats.param_bytes > stats.resident_bytes ? stats.param_bytes - stats.resident_bytes : 0;
      device_weight_bytes_ =
          stats.param_bytes - weight_bytes_kept_off_device() + extra_device_bytes();
    });
    info["param_bytes"] = param_bytes_;
    info["offloadable_bytes"] = offloadable_bytes_;
    info["device_weight_bytes"] = device_weight_bytes_;
    return info.dump();
  }
  std::once_flag bytes_measured_;
  uint64_t param_bytes_ = 0, offloadable_bytes_ = 0, device_weight_bytes_ = 0;
  std::string name_;
  std::shared_ptr<offload::TransferEngine> engine_;
  std::mutex mutex_;
  std::mutex snapshot_mutex_;
  std::string snapshot_;  // the last stats_json taken between requests
};

// ---------------------------------------------------------------------------- thinker

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

  std::string info_json() override {
    return info_with_bytes(Json{{"model_stage", "thinker"}, {"speech", capture_layer_ >= 0}});
  }

  void run(const StageCall& call, PacketQueue&, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = thinker_params(call.params_json);
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
    MediaFolder media(call.media);
    models::ChatRequest chat;
    chat.text = params.text;
    chat.system_prompt = params.system_prompt;
    chat.history = params.history;
    chat.audio_files = media.audio;
    chat.image_files = media.images;
    const auto inputs = runner_->prepare(chat);
    auto sampling = params.sampling;
    if (sampling.stop_token_ids.empty()) sampling.stop_token_ids = runner_->default_stop_tokens();

    auto& thinker = runner_->model();
    sampling.max_context = thinker.config().text.max_position_embeddings;
    auto state = thinker.new_state(params.handoff ? capture_layer_ : -1);
    models::TextStreamDecoder decoder(runner_->tokenizer());
    StopStringCutter stop(params.stop);
    size_t rows_sent = 0;
    bool first = true;
    const auto start = Clock::now();
    double prefill_ms = 0;
    const auto result = models::generate_tokens(
        [&](int64_t step, const std::vector<int64_t>& generated) -> at::Tensor {
          check_going(call, cancel);
          if (step == 0) {
            auto logits = thinker.prefill(inputs, state)[0];
            prefill_ms = ms_since(start);
            return logits;
          }
          return thinker.decode(generated.back(), state);
        },
        sampling,
        [&](int64_t token) {
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
          return !stop.stopped();  // a stop string ends the answer like a stop token
        },
        inputs.input_ids);
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

// ---------------------------------------------------------------------------- talker

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
  }

  std::string info_json() override {
    return info_with_bytes(Json{{"model_stage", "talker"},
                                {"speakers", runner_->speakers()},
                                {"default_speaker", runner_->default_speaker()},
                                {"num_code_groups", runner_->num_code_groups()}});
  }

  // The talker starts as soon as the thinker's first tokens and rows are in, and reads the
  // rest while it speaks (TalkerRunner::generate_streaming).
  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = talker_params(call.params_json);
    std::lock_guard<std::mutex> lock(mutex_);
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
    const auto run =
        runner_->generate_streaming(h, pull, request, [&](const std::vector<int64_t>& frame) {
          check_going(call, cancel);
          StagePacket packet;
          packet.frames = {frame};
          sink(std::move(packet));
          return true;
        });
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

  std::unique_ptr<models::TalkerRunner> runner_;
};

// ---------------------------------------------------------------------------- code2wav

class Code2WavStage : public LocalStageBase {
 public:
  explicit Code2WavStage(const LocalStageOptions& o) : LocalStageBase(o) {
    models::SpeechRunnerOptions ro{o.model_dir, o.dtype, o.offload};
    if (o.offload_stage) {
      ro.offload = whole_stage_offload(o.offload.pin_memory);
      ro.offload.components = {"code2wav"};
    }
    runner_ = models::Code2WavRunner::load(ro, engine_);
  }

  std::string info_json() override {
    return info_with_bytes(
        Json{{"model_stage", "code2wav"}, {"sample_rate", runner_->sample_rate()}});
  }

  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = code2wav_params(call.params_json);
    translate_errors([&] { params.stream.validate(); });
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    std::optional<offload::OffloadBackend::ForwardScope> forward;  // with the lock
    std::unique_ptr<models::qwen3_omni::Code2WavStreamer> streamer;
    std::vector<std::vector<int64_t>> frames;
    std::string upstream_reason = "none";
    double code2wav_ms = 0;
    const int64_t groups = runner_->num_quantizers();
    const auto emit = [&](const at::Tensor& samples) {
      if (samples.numel() == 0) return;
      StagePacket packet;
      packet.audio = samples.to(at::kCPU, at::kFloat).contiguous();
      sink(std::move(packet));
    };
    while (auto packet = input.pop(&cancel)) {
      if (packet->finished) upstream_reason = packet->finish_reason;
      if (packet->frames.empty()) continue;
      check_going(call, cancel);
      if (!lock.owns_lock()) {  // the first frame: this request takes the model
        lock.lock();
        forward.emplace(backend().forward_scope());
      }
      frames.insert(frames.end(), packet->frames.begin(), packet->frames.end());
      if (!params.stream_audio) continue;
      translate_errors([&] {
        at::NoGradGuard no_grad;
        if (!streamer) {
          streamer = std::make_unique<models::qwen3_omni::Code2WavStreamer>(runner_->model(),
                                                                            params.stream);
        }
        const auto start = Clock::now();
        const auto samples =
            streamer->push(models::qwen3_omni::frames_to_codes(packet->frames, groups));
        code2wav_ms += ms_since(start);
        emit(samples);
      });
    }
    StagePacket last;
    last.finished = true;
    last.finish_reason = upstream_reason;
    if (!frames.empty() && upstream_reason != "cancelled") {
      if (!lock.owns_lock()) {
        lock.lock();
        forward.emplace(backend().forward_scope());
      }
      translate_errors([&] {
        at::NoGradGuard no_grad;
        if (streamer) {
          const auto start = Clock::now();
          emit(streamer->finish());
          code2wav_ms += ms_since(start);
        }
        if (params.waveform) {
          const auto codes = models::qwen3_omni::frames_to_codes(frames, groups);
          const auto start = Clock::now();
          last.tensors.emplace_back(
              "waveform", cpu(models::qwen3_omni::chunked_decode(runner_->model(), codes, 300, 25)
                                  .to(at::kFloat)));
          if (!streamer) code2wav_ms += ms_since(start);
        }
      });
    }
    last.metrics = {{"code2wav_ms", code2wav_ms}, {"frames", static_cast<double>(frames.size())}};
    sink(std::move(last));
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }

 private:
  std::unique_ptr<models::Code2WavRunner> runner_;
};

}  // namespace

std::unique_ptr<Stage> make_local_stage(const LocalStageOptions& options) {
  if (options.model_stage == "thinker") return std::make_unique<ThinkerStage>(options);
  if (options.model_stage == "talker") return std::make_unique<TalkerStage>(options);
  if (options.model_stage == "code2wav") return std::make_unique<Code2WavStage>(options);
  throw StageError(
      StageError::Code::kInvalidArgument, options.name,
      "model_stage '" + options.model_stage + "' cannot run here (thinker, talker or code2wav)");
}

}  // namespace omni::pipeline
