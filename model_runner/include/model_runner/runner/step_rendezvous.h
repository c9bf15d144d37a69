// Gathers the model calls of concurrent requests into batches. Each request keeps its own loop
// on its own thread and hands its call here as a Ticket; the call waits until the batch is
// ready, and the thread that finds it ready runs it for every ticket in it. So each weight of
// the model runs (and, offloaded, is copied to the device) once per batch, not once per request.
//
// Ready: every member that can call now has called (a member waiting for its input is not
// waited for), or max_batch tickets wait, or the oldest has waited the straggler wait: the
// given minimum, or a quarter of the last batch's run time if longer (leaving a straggler
// behind costs it a whole batch of its own). The wait counts from the end of the last batch for
// tickets queued while it ran, so that its members, back a moment later, join them. Tickets a
// full batch left behind go next without waiting.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

namespace omni::models {

class StepRendezvous {
 public:
  // One request's call. Derive from it to carry the call's inputs and outputs.
  struct Ticket {
    std::exception_ptr error;  // set for every ticket of a batch whose run threw
    bool done = false;
    // Set by the run for a ticket it left for the next batch: it goes back to the front of the
    // queue and runs next, without the straggler wait.
    bool deferred = false;
  };
  using RunBatch = std::function<void(const std::vector<Ticket*>&)>;

  struct Stats {
    int64_t members = 0;        // requests between join and leave now
    int64_t steps = 0;          // batches run
    int64_t rows = 0;           // tickets run, summed over batches
    int64_t last_batch = 0;     // tickets in the last batch
    int64_t largest_batch = 0;  // most tickets in one batch
    double busy_ms = 0;         // time spent running batches
  };

  // `max_batch` >= 1 (smaller values count as 1).
  StepRendezvous(int64_t max_batch, std::chrono::microseconds straggler_wait);

  // A request between join and leave is waited for by each batch unless it waits for input.
  class Member {
   public:
    explicit Member(StepRendezvous& r);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    void waiting_for_input(bool waiting);

   private:
    StepRendezvous& rendezvous_;
    bool waiting_ = false;
  };

  // Queues `ticket` and returns once a batch holding it has run (the oldest tickets first, at
  // most max_batch): `run` is called on one caller's thread with the batch, and may defer some
  // of it (Ticket::deferred) to the next. Rethrows the batch's error. `run` must be the same for
  // every caller.
  void call(Ticket& ticket, const RunBatch& run);

  Stats stats() const;

 private:
  // With mutex_ held.
  bool batch_ready(std::chrono::steady_clock::time_point now) const;
  std::chrono::microseconds straggler_wait() const;

  const int64_t max_batch_;
  const std::chrono::microseconds straggler_wait_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Ticket*> pending_;
  std::chrono::steady_clock::time_point first_pending_{};
  int64_t waiting_input_ = 0;
  bool running_batch_ = false;
  bool overflow_ = false;  // the pending tickets were left behind by a full batch
  std::chrono::microseconds last_run_{0};
  Stats stats_;
};

}  // namespace omni::models
