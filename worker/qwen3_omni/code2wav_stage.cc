// The code2wav stage: codec frames in, audio chunks out as they are decoded, and the whole
// waveform at the end.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "cpu_offload/logging.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/runner/code2wav_batcher.h"
#include "model_runner/runner/speech_runners.h"
#include "worker/pipeline/local_stage_base.h"
#include "worker/qwen3_omni/payloads.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/qwen3_omni/stages.h"

namespace omni::pipeline::local {
namespace {

class Code2WavStage : public LocalStageBase {
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
    batcher_ = std::make_unique<models::Code2WavBatcher>(runner_->model(), runner_->offload(),
                                                         mutex_, windows_per_forward_);
  }

  StageInfo info() override {
    StageInfo i;
    i.model_stage = "code2wav";
    i.audio_sample_rate = runner_->sample_rate();
    return with_bytes(std::move(i));
  }

  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    c10::InferenceMode inference;  // for the whole request: no autograd bookkeeping per op
    const auto params_ptr = params_as<Code2WavParams>(call, code2wav_params);
    const Code2WavParams& params = *params_ptr;
    translate_errors([&] { params.stream.validate(); });
    // The chunks of concurrent requests decode together as their frames arrive
    // (Code2WavBatcher); each model call takes the stage's lock, not the whole request. The
    // first chunk may skip the queue (decode_first_audio).
    models::StepRendezvous::Member member(batcher_->rendezvous());
    std::unique_ptr<models::qwen3_omni::Code2WavStreamer> streamer;
    std::vector<std::vector<int64_t>> frames;
    std::string upstream_reason = "none";
    double code2wav_ms = 0;
    const int64_t groups = runner_->num_quantizers();
    bool first_chunk = true;
    const auto decode = [&](const at::Tensor& window) {
      const auto start = Clock::now();
      auto wav =
          first_chunk ? batcher_->decode_first_audio(window, member) : batcher_->decode(window);
      first_chunk = false;
      code2wav_ms += ms_since(start);
      return wav;
    };
    const auto emit = [&](const at::Tensor& samples) {
      if (samples.numel() == 0) return;
      StagePacket packet;
      packet.audio = samples.to(at::kCPU, at::kFloat).contiguous();
      sink(std::move(packet));
    };
    const auto next_packet = [&] {
      member.waiting_for_input(true);
      auto packet = input.pop(&cancel);
      member.waiting_for_input(false);
      return packet;
    };
    while (auto packet = next_packet()) {
      if (packet->finished) upstream_reason = packet->finish_reason;
      if (packet->frames.empty()) continue;
      check_going(call, cancel);
      frames.insert(frames.end(), packet->frames.begin(), packet->frames.end());
      if (!params.stream_audio) continue;
      translate_errors([&] {
        if (!streamer) {
          streamer = std::make_unique<models::qwen3_omni::Code2WavStreamer>(runner_->model(),
                                                                            params.stream, decode);
        }
        emit(streamer->push(models::qwen3_omni::frames_to_codes(packet->frames, groups)));
      });
    }
    StagePacket last;
    last.finished = true;
    last.finish_reason = upstream_reason;
    if (!frames.empty() && upstream_reason != "cancelled") {
      translate_errors([&] {
        if (streamer) emit(streamer->finish());
        if (params.waveform) {
          const auto codes = models::qwen3_omni::frames_to_codes(frames, groups);
          batcher_->run([&] {
            const auto start = Clock::now();
            auto decoded = std::make_shared<DecodedWaveform>();
            decoded->waveform =
                cpu(models::qwen3_omni::chunked_decode(runner_->model(), codes, 300, 25)
                        .to(at::kFloat));
            last.payload = std::move(decoded);
            if (!streamer) code2wav_ms += ms_since(start);
          });
        }
      });
    }
    last.metrics = {{"code2wav_ms", code2wav_ms}, {"frames", static_cast<double>(frames.size())}};
    sink(std::move(last));
  }

 protected:
  offload::OffloadBackend& backend() override { return runner_->offload(); }

  // The offload figures (as of the last moment no decode ran) and "engine": the batching's,
  // live, with the forwards run (a batch of far-apart window lengths takes several).
  std::string stats_json() override {
    Json all = Json::parse(LocalStageBase::stats_json());
    all["engine"] = batching_stats(batcher_->stats());
    all["engine"]["forwards"] = batcher_->forwards();
    all["engine"]["first_audio_forwards"] = batcher_->first_audio_forwards();
    all["engine"]["batches_in_background"] = batcher_->batches_in_background();
    all["engine"]["windows_per_forward"] = windows_per_forward_;
    return all.dump();
  }

 private:
  std::unique_ptr<models::Code2WavRunner> runner_;
  int64_t windows_per_forward_ = 1;  // the most windows one forward decodes
  std::unique_ptr<models::Code2WavBatcher> batcher_;
};

}  // namespace

std::unique_ptr<Stage> make_code2wav_stage(const LocalStageOptions& options) {
  return std::make_unique<Code2WavStage>(options);
}

}  // namespace omni::pipeline::local
