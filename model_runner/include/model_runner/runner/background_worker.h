// One long-lived thread that runs the jobs handed to it at a lower CPU priority than the threads
// that hand them over, each of which waits for its job: work that should yield to
// latency-critical work when the CPU is busy (code2wav's later chunks, while first chunks
// decode on the requests' own threads). Jobs run one at a time, in order, under InferenceMode.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace omni::models {

class BackgroundWorker {
 public:
  // The worker's nice value is the constructing thread's plus `nice_increment`, at most 19
  // (the default: the lowest priority); a system that refuses leaves it where it was, and the
  // jobs still run.
  explicit BackgroundWorker(int nice_increment = 19);
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  // Runs `job` on the worker and returns once it has run; rethrows what it threw.
  void run(const std::function<void()>& job);
  // Whether the worker's priority was lowered.
  bool lowered() const;

 private:
  struct Job;
  void loop(int nice_increment);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job*> jobs_;
  bool stopping_ = false;
  bool lowered_ = false;
  bool started_ = false;
  std::thread thread_;
};

}  // namespace omni::models
