// StepRendezvous, the batching of the talker's steps and code2wav's chunk decodes: a batch holds
// every member that calls, skips members waiting for input, leaves a straggler behind only
// after the wait, caps at max_batch, and hands a failed batch's error to each of its callers.
#include "model_runner/runner/step_rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace omni::models {
namespace {

using namespace std::chrono_literals;

// Records the size of each batch it runs.
struct Recorder {
  std::mutex mutex;
  std::vector<size_t> batches;
  StepRendezvous::RunBatch run() {
    return [this](const std::vector<StepRendezvous::Ticket*>& batch) {
      std::lock_guard<std::mutex> lock(mutex);
      batches.push_back(batch.size());
    };
  }
};

// Calls once from each of `n` threads, each a member joined beforehand that leaves after its
// call, and waits at most 20 s for them.
void call_from_threads(StepRendezvous& r, size_t n, const StepRendezvous::RunBatch& run) {
  std::vector<std::unique_ptr<StepRendezvous::Member>> members;
  for (size_t i = 0; i < n; ++i) members.push_back(std::make_unique<StepRendezvous::Member>(r));
  std::vector<std::future<void>> calls;
  for (size_t i = 0; i < n; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      StepRendezvous::Ticket t;
      r.call(t, run);
      members[i].reset();  // done: it leaves, as a finished request does
    }));
  }
  for (auto& c : calls) ASSERT_EQ(c.wait_for(20s), std::future_status::ready) << "a call hung";
}

TEST(StepRendezvous, OneBatchHoldsEveryMemberThatCalls) {
  StepRendezvous r(8, 60s);  // stragglers waited for as long as it takes
  Recorder rec;
  call_from_threads(r, 5, rec.run());
  EXPECT_EQ(rec.batches, std::vector<size_t>{5});
  const auto s = r.stats();
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.rows, 5);
  EXPECT_EQ(s.largest_batch, 5);
  EXPECT_EQ(s.members, 0);  // all left
}

TEST(StepRendezvous, BatchesHoldAtMostMaxBatch) {
  StepRendezvous r(2, 60s);
  Recorder rec;
  call_from_threads(r, 5, rec.run());
  size_t rows = 0;
  for (size_t b : rec.batches) {
    EXPECT_LE(b, 2u);
    rows += b;
  }
  EXPECT_EQ(rows, 5u);
  EXPECT_EQ(r.stats().largest_batch, 2);
}

TEST(StepRendezvous, AMemberWaitingForInputIsNotWaitedFor) {
  StepRendezvous r(8, 60s);
  StepRendezvous::Member caller(r), idle(r);
  idle.waiting_for_input(true);
  Recorder rec;
  auto call = std::async(std::launch::async, [&] {
    StepRendezvous::Ticket t;
    r.call(t, rec.run());
  });
  ASSERT_EQ(call.wait_for(20s), std::future_status::ready) << "waited for a member without input";
  EXPECT_EQ(rec.batches, std::vector<size_t>{1});
}

TEST(StepRendezvous, AStragglerIsLeftBehindAfterTheWait) {
  StepRendezvous r(8, 30ms);
  StepRendezvous::Member caller(r), straggler(r);  // the straggler never calls
  Recorder rec;
  const auto start = std::chrono::steady_clock::now();
  StepRendezvous::Ticket t;
  r.call(t, rec.run());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_EQ(rec.batches, std::vector<size_t>{1});
}

TEST(StepRendezvous, AFailedBatchThrowsInEveryCaller) {
  StepRendezvous r(8, 60s);
  std::vector<std::unique_ptr<StepRendezvous::Member>> members;
  for (int i = 0; i < 3; ++i) members.push_back(std::make_unique<StepRendezvous::Member>(r));
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      StepRendezvous::Ticket t;
      try {
        r.call(t, [](const auto&) { throw std::runtime_error("model failed"); });
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) == "model failed") ++failed;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 3);
  // The rendezvous still works after a failed batch.
  Recorder rec;
  members.clear();
  call_from_threads(r, 2, rec.run());
  EXPECT_EQ(rec.batches, std::vector<size_t>{2});
}

}  // namespace
}  // namespace omni::models
