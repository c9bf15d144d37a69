// Batches the code2wav chunk decodes of concurrent streamed answers (StepRendezvous): each
// request's streamer hands its window (left context + chunk) here, and one forward decodes the
// windows of every request that decodes now. Windows of different lengths are padded on the
// right with code 0; code2wav is causal, so each row keeps exactly the samples of its own frames.
// Windows far apart in length (a 4-frame first chunk against a 50-frame later one) are decoded
// in separate batches, shortest first: little padding. Where the weights are resident, a
// request's first chunk (its first audio) does not wait for a batch at all: it decodes at once
// on its own thread (decode_first_audio), and the batches of later chunks run on a
// BackgroundWorker at a lower CPU priority, so that on a busy CPU they yield to first chunks
// and to the other stages.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "model_runner/qwen3_omni/code2wav.h"
#include "model_runner/runner/background_worker.h"
#include "model_runner/runner/step_rendezvous.h"

namespace omni::models {

class Code2WavBatcher {
 public:
  // How long a decode waits for a member that is neither decoding nor waiting for frames.
  static constexpr std::chrono::microseconds kStragglerWait{2000};

  // `model_mutex` guards the model and its backend (the stage's lock); `max_batch` >= 1.
  Code2WavBatcher(qwen3_omni::Code2Wav& model, offload::OffloadBackend& backend,
                  std::mutex& model_mutex, int64_t max_batch,
                  std::chrono::microseconds straggler_wait = kStragglerWait);

  // Join for the whole request (StepRendezvous::Member).
  StepRendezvous& rendezvous() { return rendezvous_; }
  // Runs `fn` with the model's lock and forward scope held.
  void run(const std::function<void()>& fn);
  // Code2Wav::forward_validated(window) for one request's checked window [num_quantizers, T],
  // decoded with the windows of the others that decode now: [1, 1, T * samples_per_frame -
  // 555], the samples it gives alone (within rounding: the batch's convolutions may block the
  // work differently).
  at::Tensor decode(const at::Tensor& window);
  // decode(window) for a request's first chunk. Where the backend lets forwards overlap, it
  // runs at once on a lane of its own (one such forward at a time) beside any batch, and
  // `member` (the caller's) counts as waiting for input meanwhile, so no batch waits for it.
  at::Tensor decode_first_audio(const at::Tensor& window, StepRendezvous::Member& member);

  StepRendezvous::Stats stats() const { return rendezvous_.stats(); }
  int64_t forwards() const { return forwards_; }  // model forwards run, on either lane
  int64_t first_audio_forwards() const { return first_audio_forwards_; }  // of them, alone
  // Whether the batches run at a lower priority than the requests' threads.
  bool batches_in_background() const { return background_ && background_->lowered(); }

 private:
  struct Decode : StepRendezvous::Ticket {
    at::Tensor window;
    at::Tensor wav;
  };
  void run_batch(const std::vector<StepRendezvous::Ticket*>& batch);
  void decode_group(const std::vector<Decode*>& group);

  qwen3_omni::Code2Wav& model_;
  offload::OffloadBackend& backend_;
  std::mutex& model_mutex_;
  StepRendezvous rendezvous_;
  std::mutex first_audio_lane_;
  std::atomic<int64_t> forwards_{0};
  std::atomic<int64_t> first_audio_forwards_{0};
  std::unique_ptr<BackgroundWorker> background_;  // where forwards may overlap
};

}  // namespace omni::models
