// The Qwen3-Omni family: its stage kinds, thinker (the request in, text out, and the hidden rows
// a talker needs), talker (the thinker's rows in, codec frames out), code2wav (frames in, audio
// out); their hand-offs; a checkpoint folder's graph; the sampling defaults of its stages.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/omni_options.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/weights/hf_config.h"
#include "worker/pipeline/model_family.h"
#include "worker/pipeline/pipeline.h"
#include "worker/qwen3_omni/payloads.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/qwen3_omni/stages.h"

namespace omni::pipeline {
namespace {

// engine_args keys the speech stages do not read: the expert cache and the disk tier are the
// thinker's, and so is chunked prefill (the talker's prompt runs whole). The talker's KV comes
// from a pool of its own (block_size, kv_cache_memory_bytes); code2wav has no KV cache.
const std::vector<std::string> kThinkerOnlyKeys = {
    "cpu_offload_experts", "expert_cache_budget", "expert_prefetch",        "expert_miss_policy",
    "expert_eviction",     "host_memory_budget",  "enable_chunked_prefill", "disk_read"};

// A Qwen3-Omni stage of the kind `make`: the pipeline's component names are checked against the
// whole model's parts first (each stage then keeps its own share of them).
template <std::unique_ptr<Stage> (*make)(const LocalStageOptions&)>
std::unique_ptr<Stage> checked(const LocalStageOptions& options) {
  if (options.offload.cpu_offload_enabled) {
    models::check_component_names(options.offload.components);
  }
  return make(options);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The request's Qwen3-Omni part (Request::parts), or its defaults.
// The request's options: its part, with the caller's answer sampling on top (the text's is the
// thinker's; a seed seeds every stage).
models::OmniOptions options_of(const Request& request) {
  auto o = request.parts.value<models::OmniOptions>();
  const auto& s = request.sampling;
  if (s.seed) o.sampling.set_seed(*s.seed);
  auto& t = o.sampling.thinker;
  if (s.temperature) t.temperature = *s.temperature;
  if (s.top_p) t.top_p = *s.top_p;
  if (s.top_k) t.top_k = *s.top_k;
  if (s.repetition_penalty) t.repetition_penalty = *s.repetition_penalty;
  if (s.max_tokens) t.max_new_tokens = *s.max_tokens;
  if (s.max_audio_frames) o.max_audio_frames = *s.max_audio_frames;
  return o;
}

// The talker's frames of the answer as they come (PipelineResult::parts), for its codes.
struct TalkerFrames {
  std::vector<std::vector<int64_t>> frames;
};

// The family's figures of a request (PipelineResult::timings), zero for a stage that did not
// run; each stage's finish sets its own.
const char* const kTimings[] = {
    "thinker_prefill_ms",        "thinker_decode_tokens_per_s", "talker_ms",
    "talker_frames_per_s",       "code_predictor_ms",           "code2wav_ms",
    "code2wav_real_time_factor", "time_to_first_audio_ms"};

StageKind thinker() {
  StageKind k;
  k.name = "thinker";
  k.params = [](const Request& request, bool speak) {
    ThinkerParams p;
    p.text = request.chat.text;
    p.system_prompt = request.chat.system_prompt;
    p.history = request.chat.history;
    p.parts = request.chat.parts;
    p.sampling = options_of(request).sampling.thinker;
    p.handoff = speak;
    p.stop = request.stop_strings;
    return std::make_shared<const ThinkerParams>(std::move(p));
  };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    if (!a.primary) return true;
    auto& r = a.result;
    const bool text = a.request.text_output;
    bool go_on = true;
    for (const auto t : p.tokens) {
      r.tokens.push_back(t);
      if (text && a.callbacks.on_token && !a.callbacks.on_token(t)) go_on = false;
    }
    r.text += p.text;
    if (text && !p.text.empty() && a.callbacks.on_text && !a.callbacks.on_text(p.text)) {
      go_on = false;
    }
    if (p.finished) r.finish_reason = p.finish_reason;
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    auto& timings = a.result.timings;
    for (const char* key : kTimings) timings.emplace(key, 0.0);
    timings["thinker_prefill_ms"] = a.metric("prefill_ms");
    timings["thinker_decode_tokens_per_s"] = a.metric("decode_tokens_per_s");
  };
  k.make_local = &checked<local::make_thinker_stage>;
  return k;
}

StageKind talker() {
  StageKind k;
  k.name = "talker";
  k.reads = {"thinker"};
  k.speech = true;
  k.has_voices = true;
  k.params = [](const Request& request, bool) {
    const models::OmniOptions o = options_of(request);
    TalkerParams p;
    p.speaker = request.voice;
    p.talker = o.sampling.talker;
    p.code_predictor = o.sampling.code_predictor;
    p.max_frames = o.max_audio_frames;
    return std::make_shared<const TalkerParams>(std::move(p));
  };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    if (!a.primary) return true;
    bool go_on = true;
    auto& frames = a.result.parts.get<TalkerFrames>().frames;
    for (const auto& f : p.frames) {
      frames.push_back(f);
      if (a.callbacks.on_frame && !a.callbacks.on_frame(f)) go_on = false;
    }
    if (p.finished) a.result.audio.finish_reason = p.finish_reason;
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    auto& r = a.result;
    const StageInfo info = a.info();
    r.audio.codes = models::qwen3_omni::frames_to_codes(
        r.parts.get<TalkerFrames>().frames, talker_facts(info.family_json).num_code_groups);
    r.audio.voice = a.request.voice.empty() ? info.default_voice : lower(a.request.voice);
    r.timings["talker_ms"] = a.metric("talker_ms");
    r.timings["talker_frames_per_s"] = a.metric("frames_per_s");
    r.timings["code_predictor_ms"] = a.metric("code_predictor_ms");
  };
  k.make_local = &checked<local::make_talker_stage>;
  k.ignored_keys = kThinkerOnlyKeys;
  return k;
}

StageKind code2wav() {
  StageKind k;
  k.name = "code2wav";
  k.reads = {"talker"};
  k.speech = true;
  k.answers_audio = true;
  k.params = [](const Request& request, bool) {
    Code2WavParams p;
    p.stream_audio = request.stream_audio;
    p.stream = options_of(request).stream;
    p.waveform = request.waveform;
    return std::make_shared<const Code2WavParams>(std::move(p));
  };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    auto& r = a.result;
    if (!a.primary) {
      const auto decoded = payload_as<DecodedWaveform>(p, &DecodedWaveform::read);
      if (p.finished && decoded && decoded->waveform.defined()) {
        r.branch_outputs[a.stage] = decoded->waveform;
      }
      return true;
    }
    bool go_on = true;
    if (p.audio.defined() && p.audio.numel() > 0) {
      if (r.audio.streamed_samples == 0) r.timings["time_to_first_audio_ms"] = a.now_ms;
      r.audio.streamed_samples += p.audio.numel();
      if (a.callbacks.on_audio && !a.callbacks.on_audio(p.audio)) go_on = false;
    }
    const auto decoded = payload_as<DecodedWaveform>(p, &DecodedWaveform::read);
    if (p.finished && decoded && decoded->waveform.defined()) r.audio.waveform = decoded->waveform;
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    auto& r = a.result;
    const int64_t rate = a.info().audio_sample_rate;
    r.audio.sample_rate = rate > 0 ? rate : 24000;
    const double code2wav_ms = r.timings["code2wav_ms"] = a.metric("code2wav_ms");
    if (r.audio.waveform.defined() && r.audio.waveform.numel() > 0) {
      const double audio_s = static_cast<double>(r.audio.waveform.numel()) / r.audio.sample_rate;
      r.timings["code2wav_real_time_factor"] = code2wav_ms / 1000.0 / audio_s;
      if (!a.request.stream_audio) r.timings["time_to_first_audio_ms"] = a.metric("done_ms");
    }
  };
  k.make_local = &checked<local::make_code2wav_stage>;
  // code2wav is one component: it runs whole (or leaves whole), never layer by layer, and it
  // decodes windows, not prompts.
  k.ignored_keys = kThinkerOnlyKeys;
  k.ignored_keys.insert(k.ignored_keys.end(),
                        {"enable_layerwise_offload", "layerwise_num_gpu_layers",
                         "max_num_batched_tokens", "block_size", "kv_cache_memory_bytes"});
  return k;
}

// A hand-off that passes a packet on without what its consumer does not read.
Handoff handoff(const char* from, const char* to, void (*drop)(StagePacket&)) {
  Handoff h;
  h.name = std::string(from) + "2" + to;
  h.from = from;
  h.to = to;
  h.apply = [drop](StagePacket p) {
    p.metrics.clear();
    drop(p);
    return p;
  };
  return h;
}

// A stage's default_sampling_params: the thinker's onto the thinker's sampling, the talker's
// onto the talker's and the code predictor's (max_tokens: the frame cap). `given` names the
// command line's: "temperature", "talker.temperature".
void apply_stage_sampling(const config::StageConfig& stage, const std::set<std::string>& given,
                          models::OmniOptions& r) {
  const auto& d = stage.sampling;
  const bool talker = stage.engine.model_stage == "talker";
  if (!talker && stage.engine.model_stage != "thinker") return;
  const std::string prefix = talker ? "talker." : "";
  const auto unset = [&](const char* name) { return given.count(prefix + name) == 0; };
  auto& p = talker ? r.sampling.talker : r.sampling.thinker;
  if (d.temperature && unset("temperature")) p.temperature = *d.temperature;
  if (d.top_p && unset("top_p")) p.top_p = *d.top_p;
  if (d.top_k && unset("top_k")) p.top_k = *d.top_k;
  if (d.repetition_penalty && unset("repetition_penalty")) {
    p.repetition_penalty = *d.repetition_penalty;
  }
  if (d.max_tokens && unset("max_tokens")) {
    (talker ? r.max_audio_frames : p.max_new_tokens) = *d.max_tokens;
  }
  if (d.seed && unset("seed")) {
    p.seed = *d.seed;
    if (talker) r.sampling.code_predictor.seed = *d.seed;
  }
  if (d.greedy && unset("greedy")) {
    p.greedy = *d.greedy;
    if (talker) r.sampling.code_predictor.greedy = *d.greedy;
  }
}

class Qwen3OmniFamily : public ModelFamily {
 public:
  std::string name() const override { return "qwen3_omni"; }

  const std::vector<StageKind>& stage_kinds() const override {
    static const std::vector<StageKind> kinds = {thinker(), talker(), code2wav()};
    return kinds;
  }

  // The talker reads the thinker's tokens, hand-off rows and prompt ids (tensors), not its
  // text; code2wav reads the talker's codec frames. Both read the end (finished,
  // finish_reason).
  const std::vector<Handoff>& handoffs() const override {
    static const std::vector<Handoff> handoffs = {
        handoff("thinker", "talker", [](StagePacket& p) { p.text.clear(); }),
        handoff("talker", "code2wav", [](StagePacket& p) {
          p.tokens.clear();
          p.payload.reset();
        })};
    return handoffs;
  }

  bool claims_checkpoint(const std::string& model_dir) const override {
    std::error_code ec;
    return std::filesystem::is_regular_file(std::filesystem::path(model_dir) / "config.json", ec);
  }
  std::string checkpoint_marker() const override { return "config.json"; }

  // 0 thinker (final text); with a talker in the checkpoint, also 1 talker and 2 code2wav
  // (final audio).
  config::PipelineConfig checkpoint_graph(const CheckpointGraphOptions& o) const override {
    const bool speech = models::qwen3_omni::has_speech_output(models::HfConfig::load(o.model_dir));
    config::PipelineConfig c;
    c.path = o.where;
    c.stages.push_back(checkpoint_stage(o, 0, "thinker", {}, "text"));
    if (speech) {
      c.stages.push_back(checkpoint_stage(o, 1, "talker", {0}, ""));
      c.stages.push_back(checkpoint_stage(o, 2, "code2wav", {1}, "audio"));
    }
    return c;
  }

  void apply_sampling_defaults(const config::StageConfig& stage, const std::set<std::string>& given,
                               Request& request) const override {
    apply_stage_sampling(stage, given, request.parts.get<models::OmniOptions>());
  }
};

const RegisterModelFamily<Qwen3OmniFamily> registered;

}  // namespace

}  // namespace omni::pipeline
