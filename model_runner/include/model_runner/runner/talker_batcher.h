// Batches the talker steps of concurrent requests (StepRendezvous): each request keeps its own
// generation loop (run_talker, fed by its thinker's stream), and one Talker::step_batch runs the
// step of every request that can step now, so each talker and code predictor weight runs (and,
// offloaded, is copied) once per step for the batch. A request waiting on its thinker's text is
// not waited for. Every use of the model by the requests (prefill, text projection, steps) goes
// through run() under one lock, each with the offload backend's forward scope.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/talker.h"
#include "model_runner/runner/step_rendezvous.h"

namespace omni::models {

class TalkerBatcher {
 public:
  // `model_mutex` guards the talker and its backend (the stage's lock); `max_batch` >= 1.
  TalkerBatcher(qwen3_omni::Talker& talker, offload::OffloadBackend& backend,
                std::mutex& model_mutex, int64_t max_batch);

  // Join for the whole request (StepRendezvous::Member).
  StepRendezvous& rendezvous() { return rendezvous_; }
  // Runs `fn` with the model's lock and forward scope held.
  void run(const std::function<void()>& fn);
  // Talker::step for one request, in a batch with the others that step now.
  std::vector<int64_t> step(int64_t code0, qwen3_omni::TalkerState& state, Sampler& sampler,
                            at::Tensor& next_logits);

  StepRendezvous::Stats stats() const { return rendezvous_.stats(); }

 private:
  struct Step : StepRendezvous::Ticket {
    int64_t code0 = 0;
    qwen3_omni::TalkerState* state = nullptr;
    Sampler* sampler = nullptr;
    std::vector<int64_t> frame;
    at::Tensor logits;
  };
  void run_batch(const std::vector<StepRendezvous::Ticket*>& batch);

  qwen3_omni::Talker& talker_;
  offload::OffloadBackend& backend_;
  std::mutex& model_mutex_;
  StepRendezvous rendezvous_;
};

}  // namespace omni::models
