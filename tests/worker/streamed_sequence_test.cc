// A request fed by its source while it runs, through several engine loops in turn
// (worker/runtime/streamed_sequence.h): every source packet reaches the loops once and in order,
// each leg on its own loop's thread; a request done on an early leg skips the rest; an input
// error or a cancellation ends the request on every loop (also under TSan).
#include "worker/runtime/streamed_sequence.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace omni::pipeline {
namespace {

// What a request's legs share: the source's values not yet passed on.
struct Relay {
  std::deque<int64_t> pending;
  bool input_ended = false;
  bool done = false;
};

struct RelaySequence : StreamedSequence {
  RelaySequence(std::shared_ptr<Relay> r, int64_t limit, std::shared_ptr<StreamInbox> inbox)
      : StreamedSequence(std::move(inbox)), relay(std::move(r)), leg_limit(limit) {}
  bool request_done() const override { return relay->done; }
  std::shared_ptr<Relay> relay;
  int64_t leg_limit;  // values this leg passes on before the next leg takes over; -1: all
  int64_t passed = 0;
};

// Passes each source value on as a packet named after the loop's thread; ends the request with a
// finished packet once the source ended and every value went out.
class RelayModel : public EngineModel {
 public:
  bool admit(EngineSequence&) override { return true; }
  int64_t prompt_tokens(const EngineSequence&) override { return 0; }
  bool ready(EngineSequence& base) override {
    auto& seq = static_cast<RelaySequence&>(base);
    bool ended = false;
    for (auto& p : seq.take_input(&ended)) seq.relay->pending.push_back(p.tokens.at(0));
    seq.relay->input_ended = seq.relay->input_ended || ended;
    return !seq.relay->pending.empty() || seq.relay->input_ended;
  }
  void step(const std::vector<EngineSequence*>& batch) override {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    for (auto* base : batch) {
      auto& seq = static_cast<RelaySequence&>(*base);
      StagePacket p;
      p.text = name;
      if (!seq.relay->pending.empty()) {
        p.tokens = {seq.relay->pending.front()};
        seq.relay->pending.pop_front();
        ++seq.passed;
      } else {
        p.finished = true;
        seq.relay->done = true;
      }
      seq.out.push(std::move(p));
    }
  }
  bool finished(const EngineSequence& base) override {
    const auto& seq = static_cast<const RelaySequence&>(base);
    return seq.relay->done || seq.passed == seq.leg_limit;
  }
  void release(EngineSequence& seq) override {
    std::lock_guard<std::mutex> lock(mutex);
    released.insert(&seq);
  }
  std::mutex mutex;
  std::multiset<const EngineSequence*> released;  // under mutex
};

struct TwoLoops {
  RelayModel model;
  EngineLoop first{"stage 0 (relay)", model, EngineLimits{}, LoopThread{"first leg", 0}};
  EngineLoop second{"stage 0 (relay)", model, EngineLimits{}, LoopThread{"second leg", 0}};

  std::vector<StreamLeg> legs;

  // The legs of one request: `first_leg` values on the first loop, the rest on the second.
  const std::vector<StreamLeg>& request(int64_t first_leg) {
    auto relay = std::make_shared<Relay>();
    auto inbox = std::make_shared<StreamInbox>();
    legs = {{&first, std::make_shared<RelaySequence>(relay, first_leg, inbox)},
            {&second, std::make_shared<RelaySequence>(relay, -1, inbox)}};
    return legs;
  }
  // Both loops hold no sequence, and each leg that reached its loop (its queue closed) was
  // released there once; the others not at all.
  void expect_empty() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    const auto held = [&] {
      const auto a = first.stats(), b = second.stats();
      return a.running + a.waiting + b.running + b.waiting;
    };
    while (held() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(held(), 0);
    std::lock_guard<std::mutex> lock(model.mutex);
    for (size_t i = 0; i < legs.size(); ++i) {
      const auto& seq = legs[i].seq;
      EXPECT_EQ(model.released.count(seq.get()), seq->out.closed() ? 1u : 0u) << "leg " << i;
    }
  }
};

PacketQueue& with_values(PacketQueue& q, int64_t n) {
  for (int64_t v = 1; v <= n; ++v) {
    StagePacket p;
    p.tokens = {v};
    q.push(std::move(p));
  }
  return q;
}

// One request of `values` source values, `first_leg` of them on the first loop: what it sent.
std::vector<StagePacket> relay(TwoLoops& loops, int64_t values, int64_t first_leg) {
  PacketQueue input;
  with_values(input, values).close();
  std::vector<StagePacket> out;
  CancelToken cancel;
  run_streamed(
      loops.request(first_leg), input, [&](StagePacket&& p) { out.push_back(std::move(p)); },
      cancel);
  return out;
}

TEST(StreamedSequence, ARequestPassesThroughItsLegsInOrderWithEveryValueOnce) {
  TwoLoops loops;
  const auto out = relay(loops, 5, 2);
  ASSERT_EQ(out.size(), 6u);
  for (int64_t v = 1; v <= 5; ++v) {
    EXPECT_EQ(out[v - 1].tokens, std::vector<int64_t>{v});
    EXPECT_EQ(out[v - 1].text, v <= 2 ? "first leg" : "second leg") << v;
  }
  EXPECT_TRUE(out[5].finished);
  EXPECT_EQ(out[5].text, "second leg");
  EXPECT_EQ(loops.first.stats().finished, 1);
  EXPECT_EQ(loops.second.stats().finished, 1);
  loops.expect_empty();
}

TEST(StreamedSequence, ARequestDoneOnItsFirstLegSkipsTheRest) {
  TwoLoops loops;
  const auto out = relay(loops, 1, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[1].finished);
  EXPECT_EQ(out[1].text, "first leg");
  EXPECT_EQ(loops.second.stats().admitted, 0);
  loops.expect_empty();
}

TEST(StreamedSequence, AnInputErrorEndsTheRequestOnEveryLoop) {
  TwoLoops loops;
  PacketQueue input;
  with_values(input, 3).close(std::make_exception_ptr(std::runtime_error("the source fell over")));
  CancelToken cancel;
  try {
    run_streamed(
        loops.request(1), input, [](StagePacket&&) {}, cancel);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the source fell over");
  }
  loops.expect_empty();
}

TEST(StreamedSequence, ACancelWhileTheSourceIsStillWritingEndsTheRequestOnEveryLoop) {
  for (const int64_t first_leg : {1, 3}) {  // cancelled on the second leg, then on the first
    TwoLoops loops;
    PacketQueue input;
    with_values(input, 2);  // and the source goes on writing, never closing
    CancelToken cancel;
    int64_t seen = 0;
    try {
      run_streamed(
          loops.request(first_leg), input,
          [&](StagePacket&&) {
            if (++seen == 2) cancel.cancel();
          },
          cancel);
      ADD_FAILURE() << "no error";
    } catch (const StageError& e) {
      EXPECT_EQ(e.code(), StageError::Code::kCancelled) << e.what();
    }
    EXPECT_EQ(seen, 2);
    loops.expect_empty();
  }
}

}  // namespace
}  // namespace omni::pipeline
