// BackgroundWorker: jobs run on its own thread, one at a time, in InferenceMode, at a lower CPU
// priority than the caller's; a job's exception reaches its caller and the worker goes on.
#include "model_runner/runner/background_worker.h"

#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace omni::models {
namespace {

int this_thread_nice() { return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))); }

TEST(BackgroundWorker, RunsJobsOnItsOwnLowerPriorityThreadInInferenceMode) {
  const int caller_nice = this_thread_nice();
  BackgroundWorker worker(5);
  std::thread::id ran_on;
  int job_nice = 0;
  bool inference = false;
  char name[16] = {};
  worker.run([&] {
    pthread_getname_np(pthread_self(), name, sizeof name);
    ran_on = std::this_thread::get_id();
    job_nice = this_thread_nice();
    inference = c10::InferenceMode::is_enabled();
  });
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(inference);
  EXPECT_STREQ(name, "background job");  // what profilers and `top -H` show
  // Raising one's own nice value is allowed to every process; 19 is the ceiling.
  ASSERT_TRUE(worker.lowered());
  EXPECT_EQ(job_nice, std::min(caller_nice + 5, 19));
  EXPECT_EQ(this_thread_nice(), caller_nice) << "the caller's priority stays";
}

TEST(BackgroundWorker, AJobsErrorReachesItsCallerAndTheWorkerGoesOn) {
  BackgroundWorker worker;
  EXPECT_THROW(worker.run([] { throw std::runtime_error("job failed"); }), std::runtime_error);
  int ran = 0;
  worker.run([&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(BackgroundWorker, ConcurrentCallersEachGetTheirJobRunOneAtATime) {
  BackgroundWorker worker;
  std::atomic<int> running{0}, most{0}, total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int j = 0; j < 50; ++j) {
        int mine = 0;
        worker.run([&] {
          const int now = ++running;
          most = std::max(most.load(), now);
          mine = ++total;
          --running;
        });
        EXPECT_GT(mine, 0) << "run() returned before its job ran";
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total, 200);
  EXPECT_EQ(most, 1);
}

}  // namespace
}  // namespace omni::models
