// The server's bookkeeping of requests (worker/http/admission_queue.h, inflight_budget.h):
// running places handed out in arrival order, a bounded queue with a deadline, and one byte
// budget that refuses instead of overcommitting. Also in the ThreadSanitizer build.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/http/admission_queue.h"
#include "worker/http/inflight_budget.h"

namespace omni::http {
namespace {

using Outcome = AdmissionQueue::Outcome;
using std::chrono::milliseconds;

TEST(AdmissionQueue, RunsUpToTheLimitThenQueuesThenRefuses) {
  AdmissionQueue q(2, 1, std::chrono::seconds(30));
  AdmissionQueue::Slot a, b, c, d;
  EXPECT_EQ(q.acquire(a), Outcome::kAdmitted);
  EXPECT_EQ(q.acquire(b), Outcome::kAdmitted);
  EXPECT_FALSE(q.full());
  std::atomic<int> third{-1};
  std::thread waiter([&] { third = static_cast<int>(q.acquire(c)); });
  while (q.queued() != 1) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(q.full());
  EXPECT_EQ(q.acquire(d), Outcome::kQueueFull);  // 2 running and 1 waiting: no room
  EXPECT_EQ(q.refused_full(), 1u);
  a.release();  // the waiter gets this place
  waiter.join();
  EXPECT_EQ(third, static_cast<int>(Outcome::kAdmitted));
  EXPECT_EQ(q.running(), 2);
  a.release();  // idempotent
  EXPECT_EQ(q.running(), 2);
}

TEST(AdmissionQueue, WaitersAreAdmittedInArrivalOrder) {
  AdmissionQueue q(1, 8, std::chrono::seconds(30));
  AdmissionQueue::Slot first;
  ASSERT_EQ(q.acquire(first), Outcome::kAdmitted);
  std::vector<int> order;
  std::mutex mutex;
  std::vector<std::thread> waiters;
  std::vector<std::unique_ptr<AdmissionQueue::Slot>> slots;
  for (int i = 0; i < 4; ++i) {
    slots.push_back(std::make_unique<AdmissionQueue::Slot>());
    waiters.emplace_back([&, i, slot = slots.back().get()] {
      ASSERT_EQ(q.acquire(*slot), Outcome::kAdmitted);
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(i);
      }
      slot->release();
    });
    while (q.queued() != i + 1) std::this_thread::sleep_for(milliseconds(1));
  }
  first.release();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST(AdmissionQueue, AWaitEndsAtTheDeadlineOrWhenTheClientLeaves) {
  AdmissionQueue q(1, 4, milliseconds(200));
  AdmissionQueue::Slot running, late, gone;
  ASSERT_EQ(q.acquire(running), Outcome::kAdmitted);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(q.acquire(late), Outcome::kTimedOut);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(200));
  EXPECT_EQ(q.timed_out(), 1u);
  EXPECT_EQ(q.acquire(gone, [] { return true; }), Outcome::kGone);
  EXPECT_EQ(q.queued(), 0);
  EXPECT_FALSE(late.held());
  EXPECT_GE(q.retry_after_seconds(), 1);
}

TEST(AdmissionQueue, StopWakesEveryWaiter) {
  AdmissionQueue q(1, 4, std::chrono::seconds(60));
  AdmissionQueue::Slot running, waiting;
  ASSERT_EQ(q.acquire(running), Outcome::kAdmitted);
  std::atomic<int> outcome{-1};
  std::thread waiter([&] { outcome = static_cast<int>(q.acquire(waiting)); });
  while (q.queued() != 1) std::this_thread::sleep_for(milliseconds(1));
  q.stop();
  waiter.join();
  EXPECT_EQ(outcome, static_cast<int>(Outcome::kStopping));
  AdmissionQueue::Slot after;
  EXPECT_EQ(q.acquire(after), Outcome::kStopping);
}

TEST(InflightBudget, LeasesTakeAndGiveBackExactly) {
  InflightBudget budget(1000);
  {
    auto a = budget.lease();
    EXPECT_TRUE(a.grow(600));
    auto b = budget.lease();
    EXPECT_FALSE(b.grow(401));  // nothing taken
    EXPECT_TRUE(b.grow(400));   // exactly the rest
    EXPECT_EQ(budget.used(), 1000u);
    EXPECT_FALSE(a.grow(1));
    EXPECT_EQ(budget.refused(), 2u);
    auto moved = std::move(b);
    EXPECT_EQ(moved.bytes(), 400u);
    EXPECT_EQ(b.bytes(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  }
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.peak(), 1000u);
}

TEST(InflightBudget, ConcurrentLeasesNeverPassTheLimit) {
  InflightBudget budget(64);
  std::atomic<uint64_t> worst{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto lease = budget.lease();
        if (lease.grow(16)) {
          const uint64_t used = budget.used();
          uint64_t seen = worst.load();
          while (used > seen && !worst.compare_exchange_weak(seen, used)) {
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(worst.load(), 64u);
  EXPECT_LE(budget.peak(), 64u);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(InflightBudget, TheDefaultIsAQuarterOfTheFreeMemoryAndAtLeastTheFloor) {
  const uint64_t floor = uint64_t{1} << 20;
  const uint64_t d = default_inflight_bytes(floor);
  EXPECT_GE(d, floor);
  EXPECT_EQ(default_inflight_bytes(uint64_t{1} << 62), uint64_t{1} << 62);
}

}  // namespace
}  // namespace omni::http
