// The continuous-batching loop (worker/runtime/engine_loop.h) over a model that counts: many
// clients submit and cancel at once (also under TSan), a sequence that does not fit waits for
// room, every sequence's resources are released exactly once, the queue is bounded, a failed
// step fails its batch but not the loop, deadlines hold in the queue, and sequences waiting for
// input sit steps out while the loop sleeps.
#include "worker/runtime/engine_loop.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace omni::pipeline {
namespace {

struct CountingSequence : EngineSequence {
  explicit CountingSequence(int64_t n, int64_t slots_needed = 1) : steps(n), slots(slots_needed) {}
  int64_t steps;        // packets it emits
  int64_t slots;        // of the model's pool while running
  int64_t emitted = 0;  // the loop's thread only
  bool holds = false;
};

// Each running sequence holds `slots` of a pool of `pool` (like KV blocks); a step emits one
// packet per sequence. Checks that the loop never calls it from two threads at once.
class CountingModel : public EngineModel {
 public:
  explicit CountingModel(int64_t pool) : free_(pool) {}
  bool admit(EngineSequence& base) override {
    Busy busy(this);
    auto& seq = static_cast<CountingSequence&>(base);
    if (seq.slots > free_) return false;
    free_ -= seq.slots;
    seq.holds = true;
    ++admitted_;
    return true;
  }
  int64_t prompt_tokens(const EngineSequence&) override { return 1; }
  void step(const std::vector<EngineSequence*>& running) override {
    Busy busy(this);
    {
      std::unique_lock<std::mutex> lock(hold_mutex_);
      held_.wait(lock, [&] { return !hold_; });
    }
    largest_batch_ = std::max(largest_batch_, static_cast<int64_t>(running.size()));
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    step_thread_name_ = name;
    step_nice_ = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
    if (fail_next_step_.exchange(false)) throw std::runtime_error("the device fell over");
    for (auto* base : running) {
      auto& seq = static_cast<CountingSequence&>(*base);
      StagePacket p;
      p.tokens = {seq.emitted++};
      p.finished = seq.emitted == seq.steps;
      seq.out.push(std::move(p));
    }
  }
  bool finished(const EngineSequence& base) override {
    const auto& seq = static_cast<const CountingSequence&>(base);
    return seq.emitted == seq.steps;
  }
  void release(EngineSequence& base) override {
    Busy busy(this);
    auto& seq = static_cast<CountingSequence&>(base);
    EXPECT_TRUE(released_.insert(&seq).second) << "released twice";
    if (seq.holds) free_ += seq.slots;
    seq.holds = false;
  }

  // Steps wait while held: what is submitted meanwhile queues, so the batch after is full.
  void hold_steps(bool hold) {
    {
      std::lock_guard<std::mutex> lock(hold_mutex_);
      hold_ = hold;
    }
    held_.notify_all();
  }
  int64_t free_slots() const { return free_; }
  int64_t largest_batch() const { return largest_batch_; }
  const std::string& step_thread_name() const { return step_thread_name_; }
  int step_nice() const { return step_nice_; }
  std::atomic<bool> fail_next_step_{false};

 private:
  struct Busy {
    explicit Busy(CountingModel* m) : model(m) { EXPECT_FALSE(model->busy_.exchange(true)); }
    ~Busy() { model->busy_ = false; }
    CountingModel* model;
  };
  std::atomic<bool> busy_{false};
  std::mutex hold_mutex_;
  std::condition_variable held_;
  bool hold_ = false;  // under hold_mutex_
  int64_t free_;
  int64_t admitted_ = 0;
  int64_t largest_batch_ = 0;
  std::string step_thread_name_;
  int step_nice_ = 0;
  std::set<const EngineSequence*> released_;
};

// Drains a sequence's packets: their count, and the error code that closed it ("" if none).
std::pair<int64_t, std::string> drain(EngineSequence& seq, int64_t n = 0) {
  try {
    while (auto p = seq.out.pop()) {
      EXPECT_EQ(p->tokens.at(0), n);
      ++n;
    }
  } catch (const StageError& e) {
    return {n, code_name(e.code())};
  }
  return {n, ""};
}

TEST(EngineLoop, ConcurrentSubmitAndCancelReleaseEverySequenceOnce) {
  CountingModel model(6);
  constexpr int kClients = 16;
  std::vector<std::shared_ptr<CountingSequence>> seqs;
  // The first step waits until every client has submitted: without it a slow machine (TSan)
  // may run each client's sequence to its end before the next one submits, and nothing batches.
  model.hold_steps(true);
  std::atomic<int> submitted{0};
  {
    EngineLoop loop("stage 0 (counting)", model, EngineLimits{4, 8192, 256});
    std::vector<std::thread> clients;
    std::vector<std::pair<int64_t, std::string>> got(kClients);
    for (int i = 0; i < kClients; ++i) {
      // The ones that cancel would run forever.
      const int64_t steps = i % 4 == 3 ? int64_t{1} << 40 : 20 + i;
      seqs.push_back(std::make_shared<CountingSequence>(steps, 1 + i % 3));
    }
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        auto& seq = *seqs[i];
        loop.submit(seqs[i]);
        if (++submitted == kClients) model.hold_steps(false);
        if (i % 4 == 3) {  // cancels after a few packets (or while it still waits)
          for (int k = 0; k < 3; ++k) (void)seq.out.pop();
          seq.cancel();
        }
        got[i] = drain(seq, i % 4 == 3 ? 3 : 0);
      });
    }
    for (auto& c : clients) c.join();
    for (int i = 0; i < kClients; ++i) {
      if (i % 4 == 3) {
        EXPECT_EQ(got[i].second, "cancelled") << i;
      } else {
        EXPECT_EQ(got[i].second, "") << i;
        EXPECT_EQ(got[i].first, 20 + i) << i;
      }
    }
    const auto s = loop.stats();
    EXPECT_EQ(s.finished, kClients - kClients / 4);
    EXPECT_EQ(s.cancelled, kClients / 4);
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
    EXPECT_LE(s.max_batch, 4);  // max_num_seqs
    EXPECT_GE(s.max_batch, 2);
  }
  EXPECT_EQ(model.free_slots(), 6);  // every slot back
}

// A sequence with a prompt the loop runs through prefill(): its first packet comes with the
// prompt's last piece.
struct PromptSequence : CountingSequence {
  PromptSequence(int64_t n, int64_t prompt) : CountingSequence(n), prompt_left(prompt) {}
  int64_t prompt_left;
};

// CountingModel whose sequences have prompts: records each prefill() piece (sequence, tokens)
// and how many sequences each step decoded.
class PromptingModel : public CountingModel {
 public:
  using CountingModel::CountingModel;
  int64_t prefill_remaining(const EngineSequence& seq) override {
    return static_cast<const PromptSequence&>(seq).prompt_left;
  }
  void prefill(EngineSequence& base, int64_t max_tokens) override {
    auto& seq = static_cast<PromptSequence&>(base);
    EXPECT_GE(max_tokens, 1);
    EXPECT_LE(max_tokens, seq.prompt_left);
    pieces.emplace_back(&seq, max_tokens);
    seq.prompt_left -= max_tokens;
    if (seq.prompt_left > 0) return;
    StagePacket p;
    p.tokens = {seq.emitted++};
    p.finished = seq.emitted == seq.steps;
    seq.out.push(std::move(p));
  }
  void step(const std::vector<EngineSequence*>& running) override {
    for (auto* seq : running) EXPECT_EQ(static_cast<PromptSequence*>(seq)->prompt_left, 0);
    batches.push_back(static_cast<int64_t>(running.size()));
    pieces.emplace_back(nullptr, 0);  // a step between the pieces
    CountingModel::step(running);
  }
  std::vector<std::pair<const EngineSequence*, int64_t>> pieces;  // the loop's thread
  std::vector<int64_t> batches;
};

// Two requests decode when a 35-token prompt arrives. With chunked prefill and 10 tokens a
// step, the prompt runs 8 tokens a step beside the two decoding rows, which step between its
// pieces; without, it runs whole.
TEST(EngineLoop, ChunkedPrefillRunsALongPromptInPiecesBetweenTheDecodeSteps) {
  for (const bool chunked : {true, false}) {
    SCOPED_TRACE(chunked ? "chunked" : "whole");
    PromptingModel model(8);
    auto a = std::make_shared<PromptSequence>(int64_t{1} << 40, 1);
    auto b = std::make_shared<PromptSequence>(int64_t{1} << 40, 1);
    auto long_prompt = std::make_shared<PromptSequence>(3, 35);
    {
      EngineLimits limits{4, 10, 16};
      limits.chunked_prefill = chunked;
      EngineLoop loop("stage 0 (counting)", model, limits);
      loop.submit(a);
      loop.submit(b);
      ASSERT_TRUE(a->out.pop() && b->out.pop());  // both decode
      loop.submit(long_prompt);
      EXPECT_EQ(drain(*long_prompt), (std::pair<int64_t, std::string>{3, ""}));
      a->cancel();
      b->cancel();
      (void)drain(*a, 1);
      (void)drain(*b, 1);
      const auto s = loop.stats();
      EXPECT_EQ(s.prefill_tokens, 37);
    }
    std::vector<int64_t> sizes;
    size_t steps_between = 0;
    bool started = false;
    for (const auto& [seq, n] : model.pieces) {
      if (seq == long_prompt.get()) {
        sizes.push_back(n);
        started = true;
      } else if (seq == nullptr && started && sizes.size() < 5) {
        ++steps_between;
      }
    }
    if (chunked) {
      EXPECT_EQ(sizes, (std::vector<int64_t>{8, 8, 8, 8, 3}));
      EXPECT_GE(steps_between, 4u);  // the two decoding rows stepped after each piece
    } else {
      EXPECT_EQ(sizes, std::vector<int64_t>{35});
    }
  }
}

// Profilers and `top -H` show the loop's thread under its stage kind (15 characters at most).
TEST(EngineLoop, TheLoopsThreadIsNamedAfterItsStage) {
  for (const auto& [stage, thread] : std::vector<std::pair<std::string, std::string>>{
           {"stage 0 (counting)", "counting loop"},
           {"stage 2 (code2wav-decoder)", "code2wav-decode"},
           {"plain", "plain loop"}}) {
    CountingModel model(4);
    {
      EngineLoop loop(stage, model, EngineLimits{4, 8192, 8});
      auto seq = std::make_shared<CountingSequence>(2, 1);
      loop.submit(seq);
      EXPECT_EQ(drain(*seq).first, 2);
    }
    EXPECT_EQ(model.step_thread_name(), thread) << stage;
  }
}

// A loop may name its thread and run it at a lower CPU priority (code2wav's later chunks).
TEST(EngineLoop, ALoopThreadCanBeNamedAndRunNicer) {
  errno = 0;
  const int before = getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  for (const int increment : {0, 19}) {
    CountingModel model(4);
    int step_nice = 0;
    {
      EngineLoop loop("stage 2 (code2wav)", model, EngineLimits{4, 8192, 8},
                      LoopThread{"code2wav later", increment});
      EXPECT_EQ(loop.stats().priority_lowered, increment > 0);
      auto seq = std::make_shared<CountingSequence>(1, 1);
      loop.submit(seq);
      EXPECT_EQ(drain(*seq).first, 1);
      step_nice = model.step_nice();
    }
    EXPECT_EQ(model.step_thread_name(), "code2wav later");
    EXPECT_EQ(step_nice, std::min(before + increment, 19)) << increment;
  }
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), before);  // the calling thread keeps its own
}

TEST(EngineLoop, ASequenceThatDoesNotFitWaitsForRoom) {
  CountingModel model(3);
  EngineLoop loop("stage 0 (counting)", model, EngineLimits{8, 8192, 16});
  auto big = std::make_shared<CountingSequence>(30, 3);
  auto second = std::make_shared<CountingSequence>(5, 2);
  loop.submit(big);
  loop.submit(second);
  EXPECT_EQ(drain(*big).second, "");
  EXPECT_EQ(drain(*second).first, 5);
  EXPECT_EQ(model.largest_batch(), 1);  // never both: 3 + 2 slots do not fit 3
}

TEST(EngineLoop, TheQueueIsBoundedAndAFailedStepFailsOnlyItsBatch) {
  CountingModel model(1);
  EngineLoop loop("stage 0 (counting)", model, EngineLimits{1, 8192, 2});
  // One runs (holding the only slot), two wait, the next is refused.
  auto running = std::make_shared<CountingSequence>(100000);
  loop.submit(running);
  while (loop.stats().running == 0) std::this_thread::yield();
  auto a = std::make_shared<CountingSequence>(3);
  auto b = std::make_shared<CountingSequence>(3);
  loop.submit(a);
  loop.submit(b);
  try {
    loop.submit(std::make_shared<CountingSequence>(3));
    FAIL() << "a full queue took another request";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("retry later"), std::string::npos);
  }
  model.fail_next_step_ = true;  // fails the running batch: only `running`
  EXPECT_EQ(drain(*running).second, "internal");
  EXPECT_EQ(drain(*a), std::make_pair(int64_t{3}, std::string()));
  EXPECT_EQ(drain(*b), std::make_pair(int64_t{3}, std::string()));
  EXPECT_EQ(loop.stats().refused, 1);
}

TEST(EngineLoop, ADeadlinePassedInTheQueueFailsThatRequest) {
  CountingModel model(1);
  EngineLoop loop("stage 0 (counting)", model, EngineLimits{1, 8192, 8});
  auto first = std::make_shared<CountingSequence>(100000000);
  auto late = std::make_shared<CountingSequence>(3);
  late->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
  loop.submit(first);
  loop.submit(late);
  // Failed while `first` still runs: the queue is swept every step, not only at admission.
  EXPECT_EQ(drain(*late).second, "deadline_exceeded");
  first->cancel();
  EXPECT_EQ(drain(*first).second, "cancelled");
}

TEST(EngineLoop, StoppingFailsWhatIsStillQueued) {
  CountingModel model(1);
  auto queued = std::make_shared<CountingSequence>(3);
  auto running = std::make_shared<CountingSequence>(1000000);
  {
    EngineLoop loop("stage 0 (counting)", model, EngineLimits{1, 8192, 8});
    loop.submit(running);
    loop.submit(queued);
  }
  EXPECT_EQ(drain(*queued).second, "unavailable");
  EXPECT_EQ(drain(*running).second, "unavailable");
  EXPECT_EQ(model.free_slots(), 1);
}

// Sequences that step only as far as their input allows (a talker waiting for its thinker's
// text): the client raises `available` and wakes the loop.
struct GatedSequence : CountingSequence {
  explicit GatedSequence(int64_t n) : CountingSequence(n) {}
  std::atomic<int64_t> available{0};
  std::atomic<bool> bad_input{false};
};

class GatedModel : public CountingModel {
 public:
  GatedModel() : CountingModel(8) {}
  std::atomic<int64_t> ready_calls{0};
  bool ready(EngineSequence& base) override {
    ++ready_calls;
    auto& seq = static_cast<GatedSequence&>(base);
    if (seq.bad_input) throw StageError(StageError::Code::kInvalidArgument, "", "bad input");
    return seq.emitted < seq.available;
  }
};

TEST(EngineLoop, ASequenceWaitingForInputSitsOutTheStepsAndTheLoopSleeps) {
  GatedModel model;
  EngineLoop loop("stage 1 (gated)", model, EngineLimits{4, 8192, 8});
  auto waits = std::make_shared<GatedSequence>(3);
  auto goes = std::make_shared<GatedSequence>(10);
  goes->available = 10;
  loop.submit(waits);
  loop.submit(goes);
  // The other one finishes while the first has no input.
  EXPECT_EQ(drain(*goes), std::make_pair(int64_t{10}, std::string()));
  const int64_t steps = loop.stats().steps;
  EXPECT_EQ(steps, 10);
  EXPECT_EQ(loop.stats().running, 1);
  // Nothing is ready: no step runs (the loop sleeps, it does not spin through empty steps).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(loop.stats().steps, steps);
  // Its input, packet by packet.
  for (int64_t k = 1; k <= 3; ++k) {
    waits->available = k;
    loop.wake();
    auto p = waits->out.pop();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->tokens.at(0), k - 1);
  }
  EXPECT_EQ(drain(*waits, 3), std::make_pair(int64_t{3}, std::string()));
  EXPECT_EQ(loop.stats().finished, 2);
}

// A full batch whose sequences all wait for input, and a request queued behind it: the loop
// sleeps (the queued one cannot be admitted), it does not spin asking the batch.
TEST(EngineLoop, AQueuedRequestBehindAFullWaitingBatchDoesNotMakeTheLoopSpin) {
  GatedModel model;
  EngineLoop loop("stage 1 (gated)", model, EngineLimits{1, 8192, 8});
  auto running = std::make_shared<GatedSequence>(2);
  auto queued = std::make_shared<GatedSequence>(2);
  queued->available = 2;
  loop.submit(running);
  while (loop.stats().running < 1) std::this_thread::yield();
  loop.submit(queued);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t before = model.ready_calls;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(model.ready_calls - before, 5) << "the loop polled a batch that could not step";
  running->available = 2;
  loop.wake();
  EXPECT_EQ(drain(*running), std::make_pair(int64_t{2}, std::string()));
  EXPECT_EQ(drain(*queued), std::make_pair(int64_t{2}, std::string()));
}

TEST(EngineLoop, ASleepingSequenceCancelsAndBadInputFailsOnlyItsSequence) {
  GatedModel model;
  EngineLoop loop("stage 1 (gated)", model, EngineLimits{4, 8192, 8});
  auto sleeper = std::make_shared<GatedSequence>(5);
  auto bad = std::make_shared<GatedSequence>(5);
  auto fine = std::make_shared<GatedSequence>(4);
  loop.submit(sleeper);
  loop.submit(bad);
  loop.submit(fine);
  while (loop.stats().running < 3) std::this_thread::yield();
  sleeper->cancel();
  loop.wake();
  EXPECT_EQ(drain(*sleeper).second, "cancelled");
  bad->bad_input = true;
  fine->available = 4;
  loop.wake();
  EXPECT_EQ(drain(*bad).second, "invalid_argument");
  EXPECT_EQ(drain(*fine), std::make_pair(int64_t{4}, std::string()));
  const auto s = loop.stats();
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.finished, 1);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(model.free_slots(), 8);
}

}  // namespace
}  // namespace omni::pipeline
