// Batches the code2wav chunk decodes of concurrent streamed answers (StepRendezvous): each
// request's streamer hands its window (left context + chunk) here, and one forward decodes the
// windows of every request that decodes now. Windows of different lengths are padded on the
// right with code 0; code2wav is causal, so each row keeps exactly the samples of its own frames.
// Windows far apart in length (a 4-frame first chunk against a 50-frame later one) are decoded
// in separate batches, shortest first: little padding, and first audio never waits for a long
// chunk's forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "model_runner/qwen3_omni/code2wav.h"
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

  StepRendezvous::Stats stats() const { return rendezvous_.stats(); }
  int64_t forwards() const { return forwards_; }  // model forwards run

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
  std::atomic<int64_t> forwards_{0};
};

}  // namespace omni::models
