// The stage kinds of Qwen3-Omni: thinker (the request in, text out, and the hidden rows a talker
// needs), talker (the thinker's rows in, codec frames out), code2wav (frames in, audio out).
#include <ATen/ATen.h>

#include <algorithm>

#include "model_runner/qwen3_omni/talker_handoff.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/pipeline/pipeline.h"
#include "worker/pipeline/stage_kind.h"
#include "worker/pipeline/stage_params.h"

namespace omni::pipeline {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

StageKind thinker() {
  StageKind k;
  k.name = "thinker";
  k.params = [](const models::OmniRequest& request, bool speak) {
    ThinkerParams p;
    p.text = request.chat.text;
    p.system_prompt = request.chat.system_prompt;
    p.history = request.chat.history;
    p.parts = request.chat.parts;
    p.sampling = request.sampling.thinker;
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
      r.omni.tokens.push_back(t);
      if (text && a.callbacks.on_token && !a.callbacks.on_token(t)) go_on = false;
    }
    r.text += p.text;
    if (text && !p.text.empty() && a.callbacks.on_text && !a.callbacks.on_text(p.text)) {
      go_on = false;
    }
    if (p.finished) r.omni.finish_reason = p.finish_reason;
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    a.result.omni.timings.thinker_prefill_ms = a.metric("prefill_ms");
    a.result.omni.timings.thinker_decode_tokens_per_s = a.metric("decode_tokens_per_s");
  };
  k.make_local = &local::make_thinker_stage;
  return k;
}

StageKind talker() {
  StageKind k;
  k.name = "talker";
  k.reads = {"thinker"};
  k.speech = true;
  k.has_speakers = true;
  k.params = [](const models::OmniRequest& request, bool) {
    TalkerParams p;
    p.speaker = request.speaker;
    p.talker = request.sampling.talker;
    p.code_predictor = request.sampling.code_predictor;
    p.max_frames = request.max_audio_frames;
    return std::make_shared<const TalkerParams>(std::move(p));
  };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    if (!a.primary) return true;
    bool go_on = true;
    for (const auto& f : p.frames) {
      a.result.frames.push_back(f);
      if (a.callbacks.on_frame && !a.callbacks.on_frame(f)) go_on = false;
    }
    if (p.finished) a.result.omni.audio_finish_reason = p.finish_reason;
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    auto& r = a.result;
    const StageInfo info = a.info();
    r.omni.codes = models::qwen3_omni::frames_to_codes(
        r.frames, info.num_code_groups > 0 ? info.num_code_groups : 16);
    r.speaker = a.request.speaker.empty() ? info.default_speaker : lower(a.request.speaker);
    r.omni.timings.talker_ms = a.metric("talker_ms");
    r.omni.timings.talker_frames_per_s = a.metric("frames_per_s");
    r.omni.timings.code_predictor_ms = a.metric("code_predictor_ms");
  };
  k.make_local = &local::make_talker_stage;
  return k;
}

StageKind code2wav() {
  StageKind k;
  k.name = "code2wav";
  k.reads = {"talker"};
  k.speech = true;
  k.answers_audio = true;
  k.params = [](const models::OmniRequest& request, bool) {
    Code2WavParams p;
    p.stream_audio = request.stream_audio;
    p.stream = request.stream;
    p.waveform = request.waveform;
    return std::make_shared<const Code2WavParams>(std::move(p));
  };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    auto& r = a.result;
    if (!a.primary) {
      if (p.finished && p.tensor("waveform").defined()) {
        r.branch_outputs[a.stage] = p.tensor("waveform");
      }
      return true;
    }
    bool go_on = true;
    if (p.audio.defined() && p.audio.numel() > 0) {
      if (r.omni.streamed_samples == 0) r.omni.timings.time_to_first_audio_ms = a.now_ms;
      r.omni.streamed_samples += p.audio.numel();
      if (a.callbacks.on_audio && !a.callbacks.on_audio(p.audio)) go_on = false;
    }
    if (p.finished) {
      const auto waveform = p.tensor("waveform");
      if (waveform.defined()) r.omni.waveform = waveform;
    }
    return go_on;
  };
  k.finish = [](StageAnswer& a) {
    if (!a.primary) return;
    auto& r = a.result.omni;
    r.timings.code2wav_ms = a.metric("code2wav_ms");
    if (r.waveform.defined() && r.waveform.numel() > 0) {
      const double audio_s = static_cast<double>(r.waveform.numel()) / r.sample_rate;
      r.timings.code2wav_real_time_factor = r.timings.code2wav_ms / 1000.0 / audio_s;
      if (!a.request.stream_audio) r.timings.time_to_first_audio_ms = a.metric("done_ms");
    }
  };
  k.make_local = &local::make_code2wav_stage;
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

}  // namespace

const std::vector<Handoff>& qwen3_omni_handoffs() {
  // The talker reads the thinker's tokens, hand-off rows and prompt ids (tensors), not its text;
  // code2wav reads the talker's codec frames. Both read the end (finished, finish_reason).
  static const std::vector<Handoff> handoffs = {
      handoff("thinker", "talker", [](StagePacket& p) { p.text.clear(); }),
      handoff("talker", "code2wav", [](StagePacket& p) {
        p.tokens.clear();
        p.tensors.clear();
      })};
  return handoffs;
}

const std::vector<StageKind>& qwen3_omni_stage_kinds() {
  static const std::vector<StageKind> kinds = {thinker(), talker(), code2wav()};
  return kinds;
}

}  // namespace omni::pipeline
