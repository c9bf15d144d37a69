#include "model_runner/runner/background_worker.h"

#include <c10/core/InferenceMode.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

#include "cpu_offload/logging.h"

namespace omni::models {

struct BackgroundWorker::Job {
  const std::function<void()>* fn = nullptr;
  std::exception_ptr error;
  bool done = false;
};

BackgroundWorker::BackgroundWorker(int nice_increment) {
  thread_ = std::thread([this, nice_increment] { loop(nice_increment); });
  // The priority is settled before the first job, so lowered() holds from here on.
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return started_; });
}

BackgroundWorker::~BackgroundWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

bool BackgroundWorker::lowered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lowered_;
}

void BackgroundWorker::run(const std::function<void()>& job) {
  Job j;
  j.fn = &job;
  std::unique_lock<std::mutex> lock(mutex_);
  jobs_.push_back(&j);
  changed_.notify_all();
  changed_.wait(lock, [&] { return j.done; });
  if (j.error) std::rethrow_exception(j.error);
}

void BackgroundWorker::loop(int nice_increment) {
  pthread_setname_np(pthread_self(), "background job");  // for profilers and `top -H`
  // Linux keeps a nice value per thread: this lowers the worker's priority alone.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  const bool lowered = errno == 0 && nice_increment > 0 &&
                       setpriority(PRIO_PROCESS, tid, current + nice_increment) == 0;
  if (!lowered && nice_increment > 0) {
    log_debug(
        "background worker: could not lower its priority; its jobs run at the "
        "callers' priority");
  }
  c10::InferenceMode inference;  // the jobs are inference, as on the callers' threads
  std::unique_lock<std::mutex> lock(mutex_);
  lowered_ = lowered;
  started_ = true;
  changed_.notify_all();
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    Job* job = jobs_.front();
    jobs_.pop_front();
    lock.unlock();
    try {
      (*job->fn)();
    } catch (...) {
      job->error = std::current_exception();
    }
    lock.lock();
    job->done = true;
    changed_.notify_all();
  }
}

}  // namespace omni::models
