// The code2wav stage: codec frames in, audio chunks out as they are decoded, and the whole
// waveform at the end. Requests decode on the stage's engine loop: each step decodes the due
// windows of several requests in one forward (shortest first). Where forwards may overlap
// (resident weights), the later chunks move to a second loop at the lowest CPU priority: first
// audio never waits for them, and they yield the CPU to the thinker and the talker.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/logging.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/qwen3_omni/code2wav_windows.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/speech_runners.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/qwen3_omni/payloads.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/qwen3_omni/stages.h"
#include "worker/runtime/engine_loop.h"
#include "worker/runtime/streamed_sequence.h"

namespace omni::pipeline::local {
namespace {

// One request in code2wav: the talker's frames come in as it speaks. One loop's thread at a time.
struct Code2WavRequest {
  std::shared_ptr<const Code2WavParams> params;
  std::unique_ptr<models::qwen3_omni::Code2WavStreamer> streamer;  // with stream_audio
  std::vector<std::vector<int64_t>> frames;                        // all of them: the waveform
  std::string upstream_reason = "none";
  bool input_ended = false;
  // The window the next step decodes (set by ready()), and whether it may be the partial last
  // chunk (the talker ended and was not cancelled).
  at::Tensor window;
  bool last = false;
  bool drained = false;  // the talker's stream ended and every chunk of it is decoded
  bool done = false;
  double code2wav_ms = 0;
};

// Which part of a request a sequence carries: with a background loop, its first chunk (the main
// loop), its later chunks (the background loop), its end (the main loop).
enum class Leg { kFirstAudio, kBackground, kToTheEnd };

struct Code2WavSequence : StreamedSequence {
  Code2WavSequence(std::shared_ptr<Code2WavRequest> r, Leg l, std::shared_ptr<StreamInbox> in)
      : StreamedSequence(std::move(in)), request(std::move(r)), leg(l) {}
  bool request_done() const override { return request->done; }
  std::shared_ptr<Code2WavRequest> request;
  Leg leg;
};

class Code2WavStage : public LocalStageBase, private EngineModel {
 public:
  explicit Code2WavStage(const LocalStageOptions& o) : LocalStageBase(o) {
    models::SpeechRunnerOptions ro{o.model_dir, o.dtype, o.offload};
    if (o.offload_stage) {
      ro.offload = whole_stage_offload(o.offload.pin_memory);
      ro.offload.components = {"code2wav"};
    }
    runner_ = models::Code2WavRunner::load(ro, engine_);
    // On the CPU a forward of several windows takes longer than the same windows one by one
    // (there are no launches to share, and the batch's activations leave the caches), and each
    // request's chunk waits for the whole forward: one window a forward there.
    windows_per_forward_ = engine_->compute_device().is_cpu() ? 1 : o.limits.max_num_seqs;
    EngineModel& model = *this;
    EngineLimits limits = o.limits;
    limits.chunked_prefill = false;  // no prompts
    loop_ = std::make_unique<EngineLoop>(name_, model, limits);
    // Where forwards may not overlap, one loop decodes every chunk.
    if (runner_->offload().forwards_may_overlap()) {
      background_loop_ =
          std::make_unique<EngineLoop>(name_, model, limits, LoopThread{"code2wav later", 19});
    }
  }
  ~Code2WavStage() override {  // the loops stop before the model they step
    background_loop_.reset();
    loop_.reset();
  }

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "code2wav";
    i.audio_sample_rate = runner_->sample_rate();
    return with_bytes(std::move(i));
  }

  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    auto request = std::make_shared<Code2WavRequest>();
    request->params = params_as<Code2WavParams>(call, code2wav_params);
    translate_errors([&] { request->params->stream.validate(); });
    check_going(call, cancel);
    if (request->params->stream_audio) {
      request->streamer = std::make_unique<models::qwen3_omni::Code2WavStreamer>(
          runner_->model(), request->params->stream);
    }
    std::vector<StreamLeg> legs;
    auto inbox = std::make_shared<StreamInbox>();
    const auto add = [&](EngineLoop& loop, Leg leg) {
      auto seq = std::make_shared<Code2WavSequence>(request, leg, inbox);
      seq->deadline = call.deadline;
      legs.push_back({&loop, std::move(seq)});
    };
    if (background_loop_ && request->streamer) {
      add(*loop_, Leg::kFirstAudio);
      add(*background_loop_, Leg::kBackground);
    }
    add(*loop_, Leg::kToTheEnd);
    run_streamed(legs, input, sink, cancel);
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }

 private:
  // The offload figures (as of the last moment no decode ran) and "engine": the main loop's,
  // live, with the background loop's under "background".
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    Json& engine = all["engine"] = engine_stats(*loop_);
    engine["windows_per_forward"] = windows_per_forward_;
    engine["first_audio_forwards"] = first_audio_forwards_.load();
    engine["batches_in_background"] =
        background_loop_ && background_loop_->stats().priority_lowered;
    if (background_loop_) engine["background"] = engine_stats(*background_loop_);
    return all.dump();
  }

  // ---- EngineModel: called on the loop's thread.
  int64_t prompt_tokens(const EngineSequence&) override { return 0; }
  bool admit(EngineSequence&) override { return true; }

  // Takes the talker's frames in; ready when a window is due. Once the talker's stream ended
  // and every window is decoded, the request ends here (its waveform, its last packet).
  bool ready(EngineSequence& base) override {
    auto& leg = static_cast<Code2WavSequence&>(base);
    auto& seq = *leg.request;
    bool ended = false;
    auto packets = leg.take_input(&ended);
    translate_errors([&] {
      c10::InferenceMode inference;
      for (const auto& packet : packets) {
        if (packet.finished) seq.upstream_reason = packet.finish_reason;
        if (packet.frames.empty()) continue;
        seq.frames.insert(seq.frames.end(), packet.frames.begin(), packet.frames.end());
        if (seq.streamer) {
          seq.streamer->append(models::qwen3_omni::frames_to_codes(packet.frames, groups()));
        }
      }
    });
    seq.input_ended = seq.input_ended || ended;
    // A cancelled answer's partial last chunk is not decoded.
    seq.last = seq.input_ended && seq.upstream_reason != "cancelled";
    if (seq.streamer) {
      seq.window = seq.streamer->next_window(seq.last);
      if (seq.window.defined()) return true;
    }
    if (!seq.input_ended) return false;
    // Every chunk is out: the request ends on the main loop (at the stage's priority).
    seq.drained = true;
    if (leg.leg != Leg::kBackground) finish(leg);
    return false;
  }

  // The shortest due windows, and those close to them in length (windows_in_forward).
  std::vector<EngineSequence*> select(std::vector<EngineSequence*> ready) override {
    const auto frames = [](const EngineSequence* s) {
      return static_cast<const Code2WavSequence*>(s)->request->window.size(1);
    };
    std::stable_sort(ready.begin(), ready.end(),
                     [&](const auto* a, const auto* b) { return frames(a) < frames(b); });
    std::vector<int64_t> lengths;
    for (const auto* s : ready) lengths.push_back(frames(s));
    const auto n = models::qwen3_omni::windows_in_forward(lengths, windows_per_forward_);
    ready.resize(n);
    return ready;
  }

  void step(const std::vector<EngineSequence*>& batch) override {
    std::vector<at::Tensor> windows;
    for (auto* base : batch) {
      windows.push_back(static_cast<Code2WavSequence&>(*base).request->window);
    }
    const auto start = Clock::now();
    std::vector<at::Tensor> wavs;
    const auto decode = [&] {
      wavs = models::qwen3_omni::decode_windows(runner_->model(), windows);
    };
    if (static_cast<Code2WavSequence&>(*batch.front()).leg != Leg::kBackground &&
        background_loop_) {
      // Beside the background loop's forward, without the stage's lock (the weights stay
      // resident).
      translate_errors([&] {
        c10::InferenceMode inference;
        const auto scope = runner_->offload().overlapping_scope();
        decode();
      });
    } else {
      run_model(decode);
    }
    const double took = ms_since(start);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& leg = static_cast<Code2WavSequence&>(*batch[i]);
      auto& seq = *leg.request;
      seq.code2wav_ms += took;
      seq.window = at::Tensor();
      emit(leg.out, seq.streamer->accept(wavs[i], seq.last));
      if (leg.leg == Leg::kFirstAudio) ++first_audio_forwards_;
    }
  }

  // A leg ends where the next takes the request on (or with the request).
  bool finished(const EngineSequence& base) override {
    const auto& seq = static_cast<const Code2WavSequence&>(base);
    const auto& request = *seq.request;
    switch (seq.leg) {
      case Leg::kFirstAudio:
        return request.done || request.streamer->stats().chunks > 0;
      case Leg::kBackground:
        return request.done || request.drained;
      case Leg::kToTheEnd:
        break;
    }
    return request.done;
  }

  // The request's frames go with its last leg (or one that ended it).
  void release(EngineSequence& base) override {
    auto& seq = static_cast<Code2WavSequence&>(base);
    if (seq.leg != Leg::kToTheEnd && !seq.request->done) return;
    seq.request->streamer.reset();
    seq.request->frames.clear();
  }

  int64_t groups() const { return runner_->num_quantizers(); }

  static void emit(PacketQueue& out, const at::Tensor& samples) {
    if (samples.numel() == 0) return;
    StagePacket packet;
    packet.audio = samples.to(at::kCPU, at::kFloat).contiguous();
    out.push(std::move(packet));
  }

  // The request's whole waveform (when asked for) and its last packet.
  void finish(Code2WavSequence& leg) {
    auto& seq = *leg.request;
    StagePacket last;
    last.finished = true;
    last.finish_reason = seq.upstream_reason;
    if (!seq.frames.empty() && seq.upstream_reason != "cancelled" && seq.params->waveform) {
      const auto start = Clock::now();
      run_model([&] {
        const auto codes = models::qwen3_omni::frames_to_codes(seq.frames, groups());
        auto decoded = std::make_shared<DecodedWaveform>();
        decoded->waveform = cpu(
            models::qwen3_omni::chunked_decode(runner_->model(), codes, 300, 25).to(at::kFloat));
        last.payload = std::move(decoded);
      });
      // Streamed, the answer's time is its chunks'.
      if (!seq.streamer) seq.code2wav_ms += ms_since(start);
    }
    last.metrics = {{"code2wav_ms", seq.code2wav_ms},
                    {"frames", static_cast<double>(seq.frames.size())}};
    leg.out.push(std::move(last));
    seq.done = true;
  }

  std::unique_ptr<models::Code2WavRunner> runner_;
  int64_t windows_per_forward_ = 1;               // the most windows one forward decodes
  std::atomic<int64_t> first_audio_forwards_{0};  // first chunks decoded on their own leg
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<EngineLoop> background_loop_;  // where forwards may overlap
};

}  // namespace

std::unique_ptr<Stage> make_code2wav_stage(const LocalStageOptions& options) {
  return std::make_unique<Code2WavStage>(options);
}

}  // namespace omni::pipeline::local
