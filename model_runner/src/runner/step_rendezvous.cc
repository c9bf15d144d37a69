#include "model_runner/runner/step_rendezvous.h"

#include <algorithm>

namespace omni::models {

using Clock = std::chrono::steady_clock;

StepRendezvous::StepRendezvous(int64_t max_batch, std::chrono::microseconds straggler_wait)
    : max_batch_(std::max<int64_t>(1, max_batch)), straggler_wait_(straggler_wait) {}

StepRendezvous::Member::Member(StepRendezvous& r) : rendezvous_(r) {
  std::lock_guard<std::mutex> lock(r.mutex_);
  ++r.stats_.members;
}

StepRendezvous::Member::~Member() {
  std::lock_guard<std::mutex> lock(rendezvous_.mutex_);
  --rendezvous_.stats_.members;
  if (waiting_) --rendezvous_.waiting_input_;
  rendezvous_.changed_.notify_all();
}

void StepRendezvous::Member::waiting_for_input(bool waiting) {
  std::lock_guard<std::mutex> lock(rendezvous_.mutex_);
  if (waiting == waiting_) return;
  waiting_ = waiting;
  rendezvous_.waiting_input_ += waiting ? 1 : -1;
  rendezvous_.changed_.notify_all();
}

bool StepRendezvous::batch_ready(Clock::time_point now) const {
  if (pending_.empty() || running_batch_) return false;
  const int64_t can_call = stats_.members - waiting_input_;
  return overflow_ || static_cast<int64_t>(pending_.size()) >= std::min(can_call, max_batch_) ||
         now - first_pending_ >= straggler_wait();
}

std::chrono::microseconds StepRendezvous::straggler_wait() const {
  return std::max(straggler_wait_, last_run_ / 4);
}

void StepRendezvous::call(Ticket& ticket, const RunBatch& run) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (pending_.empty()) first_pending_ = Clock::now();
  pending_.push_back(&ticket);
  changed_.notify_all();
  while (!ticket.done) {
    if (!batch_ready(Clock::now())) {
      // A running batch notifies when it ends; else the straggler deadline is still ahead.
      if (running_batch_) {
        changed_.wait(lock);
      } else {
        changed_.wait_until(lock, first_pending_ + straggler_wait());
      }
      continue;
    }
    const auto n = static_cast<std::ptrdiff_t>(
        std::min<int64_t>(static_cast<int64_t>(pending_.size()), max_batch_));
    std::vector<Ticket*> batch(pending_.begin(), pending_.begin() + n);
    pending_.erase(pending_.begin(), pending_.begin() + n);
    // Tickets a full batch left behind go next without waiting.
    overflow_ = !pending_.empty();
    running_batch_ = true;
    lock.unlock();
    const auto start = Clock::now();
    try {
      run(batch);
    } catch (...) {
      for (auto* t : batch) t->error = std::current_exception();
    }
    const auto took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    lock.lock();
    last_run_ = took;
    stats_.busy_ms += static_cast<double>(took.count()) / 1000;
    running_batch_ = false;
    // What the run left for later goes first in the next batch, in its order.
    std::vector<Ticket*> deferred;
    for (auto* t : batch) {
      if (t->deferred && !t->error) {
        t->deferred = false;
        deferred.push_back(t);
      } else {
        t->done = true;
      }
    }
    const auto ran = n - static_cast<std::ptrdiff_t>(deferred.size());
    ++stats_.steps;
    stats_.rows += ran;
    stats_.last_batch = ran;
    stats_.largest_batch = std::max<int64_t>(stats_.largest_batch, ran);
    if (!deferred.empty()) {
      pending_.insert(pending_.begin(), deferred.begin(), deferred.end());
      overflow_ = true;
    }
    // Those that queued during the batch wait from now for its members to come back: else the
    // requests split into two groups that take turns and never merge again.
    if (!pending_.empty()) first_pending_ = Clock::now();
    changed_.notify_all();
  }
  if (ticket.error) std::rethrow_exception(ticket.error);
}

StepRendezvous::Stats StepRendezvous::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace omni::models
