#include "worker/http/admission_queue.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace omni::http {

AdmissionQueue::AdmissionQueue(int max_running, int max_queued,
                               std::chrono::milliseconds queue_timeout)
    : max_running_(std::max(1, max_running)),
      max_queued_(std::max(0, max_queued)),
      timeout_(queue_timeout) {}

void AdmissionQueue::Slot::release() {
  AdmissionQueue* queue = nullptr;
  Clock::time_point start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue = std::exchange(queue_, nullptr);
    start = start_;
  }
  if (queue != nullptr) queue->finished(start);
}

bool AdmissionQueue::Slot::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_ != nullptr;
}

AdmissionQueue::Outcome AdmissionQueue::acquire(Slot& slot, const std::function<bool()>& gone) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) return Outcome::kStopping;
  if (waiting_.empty() && running_ < max_running_) {
    ++running_;
  } else {
    if (static_cast<int>(waiting_.size()) >= max_queued_) {
      ++refused_full_;
      return Outcome::kQueueFull;
    }
    const uint64_t ticket = next_ticket_++;
    waiting_.push_back(ticket);
    const auto deadline = Clock::now() + timeout_;
    Outcome outcome = Outcome::kAdmitted;
    while (true) {
      if (stopping_) {
        outcome = Outcome::kStopping;
      } else if (waiting_.front() == ticket && running_ < max_running_) {
        ++running_;
        break;
      } else if (Clock::now() >= deadline) {
        ++timed_out_;
        outcome = Outcome::kTimedOut;
      } else if (gone) {
        lock.unlock();
        const bool left = gone();
        lock.lock();
        if (left) outcome = Outcome::kGone;
      }
      if (outcome != Outcome::kAdmitted) {
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
        changed_.notify_all();  // the next one may be first now
        return outcome;
      }
      // Polls `gone` every 100 ms; a finished request wakes the queue at once.
      changed_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    }
    waiting_.pop_front();
    changed_.notify_all();
  }
  std::lock_guard<std::mutex> slot_lock(slot.mutex_);
  slot.queue_ = this;
  slot.start_ = Clock::now();
  return Outcome::kAdmitted;
}

bool AdmissionQueue::full() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_ >= max_running_ && static_cast<int>(waiting_.size()) >= max_queued_;
}

void AdmissionQueue::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  changed_.notify_all();
}

void AdmissionQueue::finished(Clock::time_point start) {
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  --running_;
  mean_run_ms_ = mean_run_ms_ == 0 ? ms : 0.8 * mean_run_ms_ + 0.2 * ms;
  changed_.notify_all();
}

int AdmissionQueue::retry_after_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double ahead = static_cast<double>(waiting_.size() + 1) / max_running_;
  const double seconds = std::ceil(mean_run_ms_ * ahead / 1000.0);
  return static_cast<int>(std::clamp(seconds, 1.0, 60.0));
}

int AdmissionQueue::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

int AdmissionQueue::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(waiting_.size());
}

uint64_t AdmissionQueue::refused_full() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_full_;
}

uint64_t AdmissionQueue::timed_out() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timed_out_;
}

}  // namespace omni::http
