// SseQueue: the order of a streamed answer's events, text deltas that arrive before the HTTP
// thread takes them merged into one, and the end and the client's leaving as the writer sees them.
#include "worker/http/sse_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace {

using omni::http::SseQueue;
using std::chrono::milliseconds;

SseQueue make_queue() {
  return SseQueue([](const std::string& text, bool first) {
    return std::string(first ? "[first:" : "[text:") + text + "]";
  });
}

TEST(SseQueue, TextTakenLateIsOneDeltaAndOtherEventsKeepTheirPlace) {
  auto queue = make_queue();
  queue.push_text("Hel", true);
  queue.push_text("lo", false);
  queue.push("<audio 1>");
  queue.push_text(" wor", false);
  queue.push_text("ld", false);
  queue.push("<finish>");
  queue.finish();
  const auto taken = queue.take(milliseconds(0));
  EXPECT_EQ(taken.events, "[first:Hello]<audio 1>[text: world]<finish>");
  EXPECT_TRUE(taken.done);
}

TEST(SseQueue, TextTakenAsItComesIsOneDeltaEach) {
  auto queue = make_queue();
  queue.push_text("a", true);
  EXPECT_EQ(queue.take(milliseconds(0)).events, "[first:a]");
  queue.push_text("b", false);
  const auto taken = queue.take(milliseconds(0));
  EXPECT_EQ(taken.events, "[text:b]");
  EXPECT_FALSE(taken.done);
}

TEST(SseQueue, TakeWaitsForAnEventFromAnotherThread) {
  auto queue = make_queue();
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    queue.push("<event>");
  });
  const auto taken = queue.take(milliseconds(10000));
  producer.join();
  EXPECT_EQ(taken.events, "<event>");
  // Nothing pending and not done: an empty take after the wait.
  EXPECT_EQ(queue.take(milliseconds(1)).events, "");
}

TEST(SseQueue, AClientLeavingCountsOnlyBeforeTheEnd) {
  auto queue = make_queue();
  EXPECT_FALSE(queue.gone());
  queue.client_left();
  EXPECT_TRUE(queue.gone());
  auto finished = make_queue();
  finished.finish();
  finished.client_left();
  EXPECT_FALSE(finished.gone());
}

}  // namespace
