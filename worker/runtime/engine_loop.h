// A stage's scheduler (continuous batching): requests are submitted as sequences and one thread
// owns the model. Each step it drops cancelled and expired sequences, admits waiting ones while
// the batch and the step's prompt-token budget have room (the model may say "not yet", e.g. no
// KV blocks: the sequence waits, nothing fails), runs the admitted sequences' prompts (whole,
// or with chunked prefill as much as the step's token budget leaves beside the decoding rows),
// runs one batched step over the ready running sequences (those the model selects), and
// retires the finished. Outputs go to each
// sequence's own queue, which the request's thread drains into its sink: a slow client never holds
// up the batch.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/pipeline/stage.h"

namespace omni::pipeline {

// One request in an EngineLoop. A stage kind derives its own with the model's state.
class EngineSequence {
 public:
  virtual ~EngineSequence() = default;
  // What the loop emits for the request, closed after its last packet or with its error.
  PacketQueue out;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Any thread: the loop drops the sequence (and frees what it holds) at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class EngineLoop;
  std::atomic<bool> cancelled_{false};
  std::chrono::steady_clock::time_point submitted_;
};

// What a stage kind supplies; called on the loop's thread only, one call at a time.
class EngineModel {
 public:
  virtual ~EngineModel() = default;
  // Starts `seq` when there is room (runs its prompt and emits its first output, or leaves the
  // prompt to prefill()); false: it waits for a later step. Throwing fails this sequence only.
  virtual bool admit(EngineSequence& seq) = 0;
  // Prompt tokens an admitted `seq` has still to run through prefill() (0: it decodes).
  virtual int64_t prefill_remaining(const EngineSequence& /*seq*/) { return 0; }
  // Runs the next `max_tokens` (>= 1) of them; the call that ends the prompt emits the first
  // output. Throwing fails this sequence only.
  virtual void prefill(EngineSequence& /*seq*/, int64_t /*max_tokens*/) {}
  // Prompt tokens admit() will run for `seq`: counted against max_num_batched_tokens.
  virtual int64_t prompt_tokens(const EngineSequence& seq) = 0;
  // Whether `seq` takes part in the next step; one waiting for input (from its source
  // stage, which is still writing) sits it out, and the loop sleeps while none is ready until
  // wake(). May prepare the sequence (read its input, run its prompt) or finish it. Throwing fails
  // `seq` only.
  virtual bool ready(EngineSequence& /*seq*/) { return true; }
  // Which of the ready sequences (at least one) the next step runs; the others stay ready for a
  // later step. Default: all of them.
  virtual std::vector<EngineSequence*> select(std::vector<EngineSequence*> ready) { return ready; }
  // One step of the selected ready sequences together (a batched forward, sampling, outputs).
  // Throwing fails the whole batch.
  virtual void step(const std::vector<EngineSequence*>& running) = 0;
  // Whether `seq` has emitted its last packet (its out queue is then closed by the loop).
  virtual bool finished(const EngineSequence& seq) = 0;
  // The loop drops `seq` (finished, cancelled, expired or failed): free what it holds.
  virtual void release(EngineSequence& seq) = 0;
};

struct EngineLimits {
  int64_t max_num_seqs = 8;               // sequences running at once
  int64_t max_num_batched_tokens = 8192;  // prompt tokens admitted per step (one at least)
  int64_t max_waiting = 256;              // queued beyond it, submit() refuses
  // Prompts run in chunks: a step runs at most max_num_batched_tokens tokens, one per decoding
  // row and the rest of prompts, so a long prompt never stalls the decoding sequences.
  bool chunked_prefill = false;
};

// The loop's thread, as profilers and the CPU scheduler see it.
struct LoopThread {
  std::string name;        // empty: "<kind> loop", from the loop's stage name
  int nice_increment = 0;  // > 0: the thread runs at that much lower CPU priority (Linux nice)
};

// Counters since the loop started (a snapshot).
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t steps = 0;  // batched steps run
  int64_t admitted = 0, finished = 0, cancelled = 0, failed = 0, refused = 0;
  int64_t last_batch = 0, max_batch = 0;
  int64_t batch_rows = 0;                          // sum of the steps' batch sizes
  int64_t prefill_chunks = 0, prefill_tokens = 0;  // prompt parts run through prefill()
  double queue_ms_total = 0;      // submit to admission, summed over admitted sequences
  double busy_ms_total = 0;       // time the loop spent admitting (prefills) and stepping
  bool priority_lowered = false;  // LoopThread::nice_increment took effect
  double mean_batch() const { return steps > 0 ? static_cast<double>(batch_rows) / steps : 0; }
};

class EngineLoop {
 public:
  // `model` must outlive the loop. `name` prefixes errors ("stage 0 (<its kind>)").
  EngineLoop(std::string name, EngineModel& model, EngineLimits limits,
             const LoopThread& thread = {});
  // Fails whatever is waiting or running (kUnavailable) and joins the thread.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues `seq`; throws StageError kResourceExhausted when max_waiting are already queued
  // (kUnavailable while shutting down).
  void submit(const std::shared_ptr<EngineSequence>& seq);
  // Any thread: something a sequence waited for arrived (its input, its cancellation).
  void wake();
  EngineStats stats() const;
  const EngineLimits& limits() const { return limits_; }

 private:
  using Running = std::vector<std::shared_ptr<EngineSequence>>;
  void run();
  // Drops `seq` from the loop: release() and close its queue (with `error` if any).
  void retire(EngineSequence& seq, std::exception_ptr error);
  void admit_waiting();
  // Runs the prompts of admitted sequences (EngineModel::prefill) in admission order: each
  // whole, or with chunked_prefill what the step's budget leaves beside `decoding` rows. True
  // when any ran; a failing one fails its sequence only.
  bool run_prompts(int64_t decoding);
  // Fails the running sequence at `it` (a prompt or ready() threw `error`): counted, retired,
  // erased. Returns the next.
  Running::iterator fail_running(Running::iterator it, const std::exception_ptr& error);
  // The running sequences that are not finished and are ready; fails those whose ready()
  // throws.
  std::vector<EngineSequence*> ready_batch();
  // Nothing was ready: sleeps until wake(), a submission, or the nearest deadline.
  void sleep_until_woken();
  // Counts `gone` (finished, cancelled, expired, or failed by `step_error`) in the stats, then
  // retires each.
  void leave(const std::vector<std::shared_ptr<EngineSequence>>& gone,
             const std::exception_ptr& step_error);

  std::string name_;
  EngineModel& model_;
  EngineLimits limits_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<EngineSequence>> waiting_;  // under mutex_
  bool stopping_ = false;                                // under mutex_
  bool woken_ = false;                                   // under mutex_: wake() since the step
  EngineStats stats_;                                    // under mutex_
  Running running_;                                      // the loop's thread only
  std::thread thread_;
};

}  // namespace omni::pipeline
