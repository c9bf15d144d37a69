// The orchestrator: runs a request through the stage graph of a stage config, whatever the
// stages are (in this process, or workers over gRPC). Each stage runs on its own thread and
// reads its upstream's packets as they are written, so the stages overlap: an audio decoder
// decodes the first small chunk while the model before it still speaks, and time to first audio
// does not wait for the whole answer. A failing stage fails the request with an error naming it
// (the other stages are cancelled, nothing hangs); cancellation and the deadline reach every stage.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "worker/pipeline/device_ledger.h"
#include "worker/pipeline/family_parts.h"
#include "worker/pipeline/request.h"
#include "worker/pipeline/stage.h"
#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

struct PipelineStage {
  int64_t id = 0;
  std::string model_stage;       // a registered stage kind (stage_kind.h)
  std::vector<int64_t> sources;  // engine_input_source: the stages it reads, any number
  std::shared_ptr<Stage> stage;
  // custom_process_input_func: the hand-off (stage_kind.h) of what it reads; empty: the one
  // registered for its sources' kind and its own.
  std::string input_func = "";
};

struct PipelineCallbacks {
  // The answer's text as it is written (whole UTF-8 characters); false cancels.
  std::function<bool(const std::string& text)> on_text;
  std::function<bool(int64_t token)> on_token;
  std::function<bool(const std::vector<int64_t>& frame)> on_frame;
  // Samples (float32, CPU) of each streamed chunk.
  std::function<bool(const at::Tensor& samples)> on_audio;
  // A denoising step as it ends: its packet's metrics (step, steps, timestep, step_ms);
  // false cancels.
  std::function<bool(const std::map<std::string, double>& progress)> on_progress;
  // Polled while the request runs (every 20 ms): true cancels it in every stage (a client that
  // went away while no text or audio was being produced).
  std::function<bool()> cancelled;
};

// The answer's audio: what the stage that answers with audio wrote.
struct AudioResult {
  // [samples] float32 (CPU), the whole answer decoded at the end; empty without audio.
  at::Tensor waveform;
  int64_t sample_rate = 0;
  int64_t streamed_samples = 0;  // total samples passed to on_audio
  // The codec's codes the audio was decoded from: [codes per frame, frames] int64 (CPU).
  at::Tensor codes;
  std::string voice;                   // the voice that spoke (lower case)
  std::string finish_reason = "none";  // stop | length | cancelled | none (no audio)
};

struct PipelineResult {
  std::string text;
  std::vector<int64_t> tokens;  // the text's token ids (the stop token included)
  std::string finish_reason;    // the text's: stop | length | cancelled
  AudioResult audio;
  // A denoising stage's frames: [F, H, W, 3] float32 in [0, 1] (CPU), undefined if cancelled;
  // the frame rate its folder names, and the steps it reported.
  at::Tensor video;
  int64_t video_fps = 0;
  // An image stage's images: [N, H, W, 3] float32 in [0, 1] (CPU), undefined if
  // cancelled.
  at::Tensor images;
  int64_t progress_packets = 0;
  // Figures of the request by name: total_ms, time_to_first_audio_ms, and each family's own.
  std::map<std::string, double> timings;
  // Per stage (by name): its final packet's metrics plus the wall time from the request start
  // to the stage's first and last packet (first_packet_ms, done_ms).
  std::map<std::string, std::map<std::string, double>> stage_metrics;
  // Bytes the orchestrator forwarded from a stage to its consumers (tensors, ids, frames).
  uint64_t bytes_between_stages = 0;
  // A stage of a kind another stage already answers with (a second branch of the graph): its
  // final output by stage name (a second decoder's waveform).
  std::map<std::string, at::Tensor> branch_outputs;
  // What the families keep of the request while it runs, by type.
  FamilyParts parts;
};

class Pipeline {
 public:
  // Checks the graph: registered kinds, every source exists and is of a kind the stage reads, no
  // cycle, at least one stage that reads the request. Names no kind itself.
  explicit Pipeline(const std::vector<PipelineStage>& stages);

  // Runs `request` through the stages it needs (a speech kind only when audio is asked for).
  // Every stage reads the packets of all its sources as they come (StagePacket::source says
  // whose); the first stage of each kind answers, the others' outputs go to branch_outputs. Throws
  // StageError naming the stage that failed (or kDeadlineExceeded / kCancelled), omni::Error
  // for a request the pipeline cannot run (audio from a pipeline that answers none).
  // `media`: the inputs as bytes (a server receives them so) instead of the request's
  // chat.audio_files / image_files, which are then ignored; audio first, then images, as the
  // prompt orders them.
  PipelineResult generate(
      const Request& request, const PipelineCallbacks& callbacks = {},
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
      const std::vector<MediaFile>* media = nullptr);

  // A stage of the pipeline answers with audio.
  bool has_speech() const;
  // A stage of the pipeline answers with video frames (a denoising stage).
  bool has_video() const;
  // A stage of the pipeline answers with still images.
  bool has_images() const;
  // The voices and default of the stage that chooses them (its info), empty without one.
  std::vector<std::string> voices();
  std::string default_voice();
  // Samples per second of the stage that answers audio (its info); 0 without one.
  int64_t audio_sample_rate();
  // The prompt limit of the first stage that reports one (StageInfo::max_prompt_bytes and
  // context_tokens); zeros when none does.
  std::pair<uint64_t, int64_t> prompt_limit();
  const std::vector<PipelineStage>& stages() const { return stages_; }
  // Stages that share a device take grants from `ledger` while they compute; on a device whose
  // stages do not fit its budget together, a stage starts once its upstream has finished (the
  // stages take turns instead of streaming to each other). Set before the first request.
  void set_device_ledger(std::shared_ptr<DeviceLedger> ledger) { ledger_ = std::move(ledger); }
  DeviceLedger* device_ledger() { return ledger_.get(); }
  // {"<stage name>": <its stats_json, or {"error": ...} when it does not answer>, ...,
  //  "device_ledger": {...} (only with a ledger)}. Waits for no running request.
  std::string stats_json();

 private:
  StageInfo info_of(size_t index);       // stages_[index]'s info, asked once
  StageInfo voice_info();                // of the first stage whose kind has voices
  std::vector<PipelineStage> stages_;    // topological order
  std::vector<const StageKind*> kinds_;  // stages_[i]'s kind
  std::vector<bool> primary_;            // stages_[i] is the first of its kind
  // What a consumer reads of a source's packets, by (source id, consumer id); absent: all.
  std::map<std::pair<int64_t, int64_t>, const Handoff*> handoffs_;
  std::mutex info_mutex_;
  std::map<size_t, StageInfo> info_;
  std::shared_ptr<DeviceLedger> ledger_;
};

}  // namespace omni::pipeline
