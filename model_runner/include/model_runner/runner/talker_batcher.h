// Batches the talker steps of concurrent requests: each request keeps its own generation loop
// (run_talker, fed by its thinker's stream), and its step waits here until every request that
// can step now has asked too; one of them then runs Talker::step_batch for all, so each talker
// and code predictor weight runs (and, offloaded, is copied) once per step for the batch. A
// request waiting on its thinker's text is not waited for. Every use of the model by the
// requests (prefill, text projection, steps) goes through run() under one lock, each with the
// offload backend's forward scope.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/talker.h"

namespace omni::models {

class TalkerBatcher {
 public:
  // `model_mutex` guards the talker and its backend (the stage's lock); `max_batch` >= 1.
  TalkerBatcher(qwen3_omni::Talker& talker, offload::OffloadBackend& backend,
                std::mutex& model_mutex, int64_t max_batch);

  // A request between join and leave is waited for at each step unless it waits for input.
  class Member {
   public:
    explicit Member(TalkerBatcher& b);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    // While it waits for its thinker's text: not waited for by a step.
    void waiting_for_input(bool waiting);

   private:
    TalkerBatcher& batcher_;
    bool waiting_ = false;
  };

  // Runs `fn` with the model's lock and forward scope held.
  void run(const std::function<void()>& fn);
  // Talker::step for one request, in a batch with the others that step now.
  std::vector<int64_t> step(int64_t code0, qwen3_omni::TalkerState& state, Sampler& sampler,
                            at::Tensor& next_logits);

  int64_t steps() const;  // batched steps run
  int64_t rows() const;   // requests stepped, summed over steps
  int64_t largest_batch() const;

 private:
  struct Pending {
    int64_t code0;
    qwen3_omni::TalkerState* state;
    Sampler* sampler;
    std::vector<int64_t> frame;
    at::Tensor logits;
    std::exception_ptr error;
    bool done = false;
  };
  // With mutex_ held: every member that can step has asked, or the first waited long enough.
  bool batch_ready(std::chrono::steady_clock::time_point now) const;
  void run_batch(const std::vector<Pending*>& batch);

  qwen3_omni::Talker& talker_;
  offload::OffloadBackend& backend_;
  std::mutex& model_mutex_;
  int64_t max_batch_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Pending*> pending_;  // under mutex_
  std::chrono::steady_clock::time_point first_pending_{};
  int64_t members_ = 0, waiting_input_ = 0;
  bool running_batch_ = false;
  int64_t steps_ = 0, rows_ = 0, largest_batch_ = 0;
};

}  // namespace omni::models
