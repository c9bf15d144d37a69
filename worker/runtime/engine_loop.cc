#include "worker/runtime/engine_loop.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <future>

#include <algorithm>
#include <utility>

namespace omni::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

std::exception_ptr stage_error(StageError::Code code, const std::string& message) {
  return std::make_exception_ptr(StageError(code, "", message));
}

// The model's error as a StageError (what the request's caller expects): an unknown one is
// internal.
std::exception_ptr as_stage_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const StageError&) {
    return error;
  } catch (const std::exception& e) {
    return stage_error(StageError::Code::kInternal, e.what());
  } catch (...) {
    return stage_error(StageError::Code::kInternal, "unknown error");
  }
}

// "stage 1 (talker)" -> "talker loop": what profilers and `top -H` show for the loop's thread
// (15 characters at most) unless `thread` names it. Then lowers its priority as asked: Linux
// keeps a nice value per thread. True when lowered.
bool set_up_this_thread(const std::string& stage, const LoopThread& thread) {
  std::string name = thread.name;
  if (name.empty()) {
    const auto open = stage.find('(');
    const auto close = stage.rfind(')');
    const std::string kind = open != std::string::npos && close != std::string::npos && close > open
                                 ? stage.substr(open + 1, close - open - 1)
                                 : stage;
    name = kind + " loop";
  }
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  if (thread.nice_increment <= 0) return false;
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  return errno == 0 && setpriority(PRIO_PROCESS, tid, current + thread.nice_increment) == 0;
}

}  // namespace

EngineLoop::EngineLoop(std::string name, EngineModel& model, EngineLimits limits,
                       const LoopThread& thread)
    : name_(std::move(name)), model_(model), limits_(limits) {
  limits_.max_num_seqs = std::max<int64_t>(1, limits_.max_num_seqs);
  limits_.max_num_batched_tokens = std::max<int64_t>(1, limits_.max_num_batched_tokens);
  limits_.max_waiting = std::max<int64_t>(1, limits_.max_waiting);
  // The thread is set up before the first step, so stats() tells its priority from here on.
  std::promise<bool> lowered;
  auto set_up = lowered.get_future();
  thread_ = std::thread([this, thread, &lowered] {
    lowered.set_value(set_up_this_thread(name_, thread));
    run();
  });
  const bool priority_lowered = set_up.get();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.priority_lowered = priority_lowered;
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void EngineLoop::submit(const std::shared_ptr<EngineSequence>& seq) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      throw StageError(StageError::Code::kUnavailable, "", name_ + " is shutting down");
    }
    if (static_cast<int64_t>(waiting_.size()) >= limits_.max_waiting) {
      ++stats_.refused;
      throw StageError(StageError::Code::kResourceExhausted, "",
                       name_ + " is at capacity: " + std::to_string(waiting_.size()) +
                           " requests are already waiting; retry later");
    }
    seq->submitted_ = Clock::now();
    waiting_.push_back(seq);
    stats_.waiting = static_cast<int64_t>(waiting_.size());
  }
  wake_.notify_all();
}

void EngineLoop::wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  wake_.notify_all();
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void EngineLoop::retire(EngineSequence& seq, std::exception_ptr error) {
  try {
    model_.release(seq);
  } catch (...) {
    if (!error) error = as_stage_error(std::current_exception());
  }
  seq.out.close(error);
}

void EngineLoop::admit_waiting() {
  int64_t tokens = 0;
  while (static_cast<int64_t>(running_.size()) < limits_.max_num_seqs) {
    std::shared_ptr<EngineSequence> seq;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (waiting_.empty()) break;
      seq = waiting_.front();
    }
    bool started = false;
    std::exception_ptr error;
    if (seq->cancelled()) {
      error = stage_error(StageError::Code::kCancelled, "the request was cancelled");
    } else if (Clock::now() >= seq->deadline) {
      error = stage_error(StageError::Code::kDeadlineExceeded, "the request's deadline passed");
    } else {
      // With chunked prefill the step's budget is spent by run_prompts, not by admission.
      const int64_t cost = limits_.chunked_prefill ? 0 : model_.prompt_tokens(*seq);
      // The first prompt of a step always goes, however long: it cannot wait for room that
      // never comes.
      if (tokens > 0 && tokens + cost > limits_.max_num_batched_tokens) break;
      try {
        started = model_.admit(*seq);
      } catch (...) {
        error = as_stage_error(std::current_exception());
      }
      if (!started && !error) break;  // no room yet: it stays first in line
      tokens += cost;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting_.pop_front();
      stats_.waiting = static_cast<int64_t>(waiting_.size());
      if (started) {
        ++stats_.admitted;
        stats_.queue_ms_total +=
            std::chrono::duration<double, std::milli>(Clock::now() - seq->submitted_).count();
      } else {
        ++(seq->cancelled() ? stats_.cancelled : stats_.failed);
      }
    }
    if (started) {
      running_.push_back(std::move(seq));
    } else {
      retire(*seq, error);
    }
  }
}

void EngineLoop::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) {
        const auto error = stage_error(StageError::Code::kUnavailable, name_ + " is shutting down");
        for (auto& seq : waiting_) running_.push_back(std::move(seq));
        waiting_.clear();
        lock.unlock();
        for (auto& seq : running_) retire(*seq, error);
        running_.clear();
        return;
      }
    }
    // Cancelled and expired sequences leave before the step: what they hold is free for it,
    // and a client waiting in the queue hears at once.
    const auto now = Clock::now();
    std::vector<std::shared_ptr<EngineSequence>> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->cancelled() || now >= (*it)->deadline) {
          gone.push_back(std::move(*it));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      stats_.waiting = static_cast<int64_t>(waiting_.size());
    }
    std::vector<std::shared_ptr<EngineSequence>> keep;
    for (auto& seq : running_) {
      (seq->cancelled() || now >= seq->deadline ? gone : keep).push_back(std::move(seq));
    }
    running_ = std::move(keep);
    leave(gone, nullptr);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      woken_ = false;  // a wake() from here on is seen by the sleep below
    }
    const auto busy_start = Clock::now();
    admit_waiting();
    int64_t decoding = 0;
    for (const auto& seq : running_) {
      if (model_.prefill_remaining(*seq) == 0 && !model_.finished(*seq)) ++decoding;
    }
    const bool prompts_ran = run_prompts(decoding);
    auto batch = ready_batch();
    const bool any_finished = std::any_of(running_.begin(), running_.end(),
                                          [&](const auto& seq) { return model_.finished(*seq); });
    if (batch.empty() && !any_finished && !running_.empty() && !prompts_ran) {
      sleep_until_woken();
      continue;
    }
    std::exception_ptr step_error;
    if (!batch.empty()) {
      try {
        batch = model_.select(std::move(batch));
        model_.step(batch);
      } catch (...) {
        step_error = as_stage_error(std::current_exception());
      }
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.steps;
      stats_.last_batch = static_cast<int64_t>(batch.size());
      stats_.max_batch = std::max(stats_.max_batch, stats_.last_batch);
      stats_.batch_rows += stats_.last_batch;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.busy_ms_total +=
          std::chrono::duration<double, std::milli>(Clock::now() - busy_start).count();
    }
    keep.clear();
    gone.clear();
    for (auto& seq : running_) {
      (model_.finished(*seq) || step_error ? gone : keep).push_back(std::move(seq));
    }
    running_ = std::move(keep);
    leave(gone, step_error);
  }
}

EngineLoop::Running::iterator EngineLoop::fail_running(Running::iterator it,
                                                       const std::exception_ptr& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.failed;
    stats_.running = static_cast<int64_t>(running_.size()) - 1;
  }
  retire(**it, as_stage_error(error));
  return running_.erase(it);
}

bool EngineLoop::run_prompts(int64_t decoding) {
  int64_t budget = limits_.max_num_batched_tokens - decoding;
  bool ran = false;
  for (auto it = running_.begin(); it != running_.end();) {
    auto& seq = **it;
    try {
      const int64_t remaining = model_.prefill_remaining(seq);
      if (remaining > 0) {
        if (limits_.chunked_prefill && budget <= 0) break;
        const int64_t n = limits_.chunked_prefill ? std::min(remaining, budget) : remaining;
        model_.prefill(seq, n);
        budget -= n;
        ran = true;
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.prefill_chunks;
        stats_.prefill_tokens += n;
      }
    } catch (...) {
      it = fail_running(it, std::current_exception());
      continue;
    }
    ++it;
  }
  return ran;
}

std::vector<EngineSequence*> EngineLoop::ready_batch() {
  // Sequences admit() already finished (a one-token answer) leave without a step; those with
  // prompt left to run sit it out.
  std::vector<EngineSequence*> batch;
  std::vector<std::shared_ptr<EngineSequence>> failed;
  for (auto it = running_.begin(); it != running_.end();) {
    auto& seq = **it;
    bool ready = false;
    try {
      ready = !model_.finished(seq) && model_.prefill_remaining(seq) == 0 && model_.ready(seq) &&
              !model_.finished(seq);
    } catch (...) {
      it = fail_running(it, std::current_exception());
      continue;
    }
    if (ready) batch.push_back(&seq);
    ++it;
  }
  return batch;
}

void EngineLoop::sleep_until_woken() {
  auto until = Clock::now() + std::chrono::seconds(1);
  for (const auto& seq : running_) until = std::min(until, seq->deadline);
  // A queued request wakes the loop only if it can be admitted: with the batch full it would
  // spin until a running sequence's input came.
  const bool room = static_cast<int64_t>(running_.size()) < limits_.max_num_seqs;
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& seq : waiting_) until = std::min(until, seq->deadline);
  wake_.wait_until(lock, until, [&] { return stopping_ || woken_ || (room && !waiting_.empty()); });
}

void EngineLoop::leave(const std::vector<std::shared_ptr<EngineSequence>>& gone,
                       const std::exception_ptr& step_error) {
  // The figures first: a client that sees its queue closed sees them too.
  std::vector<std::exception_ptr> errors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    for (const auto& seq : gone) {
      if (model_.finished(*seq)) {
        ++stats_.finished;
        errors.emplace_back();
      } else if (seq->cancelled()) {
        ++stats_.cancelled;
        errors.push_back(stage_error(StageError::Code::kCancelled, "the request was cancelled"));
      } else if (now >= seq->deadline) {
        ++stats_.failed;
        errors.push_back(
            stage_error(StageError::Code::kDeadlineExceeded, "the request's deadline passed"));
      } else {
        ++stats_.failed;
        errors.push_back(step_error);
      }
    }
    stats_.running = static_cast<int64_t>(running_.size());
  }
  for (size_t i = 0; i < gone.size(); ++i) retire(*gone[i], errors[i]);
}

}  // namespace omni::pipeline
