// Admission of requests to the pipeline: at most `max_running` run at once; beyond that a
// request waits in a bounded FIFO queue up to a deadline, as vLLM's server queues what its
// engine cannot run yet. Only a full queue (429) or a wait past the deadline (503) refuses, each
// with a Retry-After estimated from how long recent requests ran.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

namespace omni::http {

class AdmissionQueue {
 public:
  using Clock = std::chrono::steady_clock;

  AdmissionQueue(int max_running, int max_queued, std::chrono::milliseconds queue_timeout);

  // A running request's place; released once (release(), or the destructor).
  class Slot {
   public:
    Slot() = default;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { release(); }
    // Frees the place for the next request (thread-safe, idempotent).
    void release();
    bool held() const;

   private:
    friend class AdmissionQueue;
    AdmissionQueue* queue_ = nullptr;
    Clock::time_point start_;
    mutable std::mutex mutex_;
  };

  enum class Outcome { kAdmitted, kQueueFull, kTimedOut, kGone, kStopping };
  // Waits for a place; `gone` is polled while queued (a client that left gives up its place).
  Outcome acquire(Slot& slot, const std::function<bool()>& gone = {});
  // Whether a request arriving now would be refused as kQueueFull (checked before its body is
  // parsed; acquire() decides for good).
  bool full() const;
  // Wakes every waiter with kStopping; later calls get kStopping at once.
  void stop();

  // Seconds a refused client should wait before retrying: the recent mean run time times the
  // requests ahead of it per running place, from 1 to 60.
  int retry_after_seconds() const;

  int max_running() const { return max_running_; }
  int max_queued() const { return max_queued_; }
  std::chrono::milliseconds queue_timeout() const { return timeout_; }
  int running() const;
  int queued() const;
  uint64_t refused_full() const;
  uint64_t timed_out() const;

 private:
  void finished(Clock::time_point start);

  const int max_running_, max_queued_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<uint64_t> waiting_;  // tickets, oldest first
  uint64_t next_ticket_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  double mean_run_ms_ = 0;  // exponential moving average of run times
  uint64_t refused_full_ = 0, timed_out_ = 0;
};

}  // namespace omni::http
