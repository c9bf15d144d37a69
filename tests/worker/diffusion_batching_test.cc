// The diffusion stage's engine loop (worker/wan/diffusion_stage.cc) on the tiny two-expert Wan
// folder: requests with their own prompts, seeds, guidance and step counts denoise together,
// each giving its frames alone bit for bit; a request joins a running batch at a step boundary
// and leaves when its own schedule ends; one cancelled mid-run or refused leaves the others
// untouched.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "worker/diffusers/diffusion_params.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/local_stages.h"

namespace omni::pipeline {
namespace {

using Json = nlohmann::json;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/wan22_a14b_pipeline_tiny";

// The fixture's stage with room for four requests at once.
std::unique_ptr<Stage> batching_stage() {
  auto config = checkpoint_stage_config(kDir, "cpu", "auto");
  config.stages.at(0).engine.max_num_seqs = 4;
  return make_local_stage(local_stage_options(config.stages.at(0), "cpu"));
}

DiffusionParams params(int k, int64_t steps, double guidance) {
  DiffusionParams p;
  p.prompt = "a red fox in the snow, take " + std::to_string(k);
  auto& d = p.request;
  d.height = 32;
  d.width = 32;
  d.num_frames = 5;
  d.num_inference_steps = steps;
  d.guidance_scale = guidance;
  d.seed = 7 + k;
  d.max_sequence_length = 16;
  return p;
}

struct Outcome {
  at::Tensor frames;
  int64_t steps = 0;                      // step packets seen
  std::optional<StageError::Code> error;  // the request's error, if any
  std::string message;
};

// Runs `p` on `stage` to its end; `on_step(step, cancel)` sees each step packet.
Outcome run(Stage& stage, const DiffusionParams& p,
            const std::function<void(int64_t, CancelToken&)>& on_step = {}) {
  StageCall call;
  call.params = std::make_shared<JsonParams>(p.to_json());
  PacketQueue input;
  input.close();
  CancelToken cancel;
  Outcome o;
  try {
    stage.run(
        call, input,
        [&](StagePacket&& packet) {
          if (packet.finished) {
            o.frames = packet.tensor("frames");
            return;
          }
          ++o.steps;
          if (on_step) on_step(o.steps, cancel);
        },
        cancel);
  } catch (const StageError& e) {
    o.error = e.code();
    o.message = e.what();
  }
  return o;
}

Json engine(Stage& stage) { return Json::parse(stage.stats_json())["engine"]; }

TEST(DiffusionBatching, RequestsTogetherGiveTheirFramesAlone) {
  auto stage = batching_stage();
  // Guidance 1 runs no unconditional pass: a batch mixes one and two passes a request.
  const std::vector<DiffusionParams> requests = {params(0, 4, 5.0), params(1, 4, 3.0),
                                                 params(2, 4, 1.0), params(3, 4, 7.5)};
  std::vector<Outcome> alone;
  for (const auto& p : requests) alone.push_back(run(*stage, p));
  std::vector<Outcome> together(requests.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < requests.size(); ++k) {
    threads.emplace_back([&, k] { together[k] = run(*stage, requests[k]); });
  }
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < requests.size(); ++k) {
    ASSERT_FALSE(together[k].error) << together[k].message;
    ASSERT_TRUE(alone[k].frames.defined()) << k;
    EXPECT_TRUE(at::equal(together[k].frames, alone[k].frames)) << k;
    EXPECT_EQ(together[k].steps, 4) << k;
    if (k > 0) {
      EXPECT_FALSE(at::equal(alone[k].frames, alone[0].frames)) << k;
    }
  }
  const Json e = engine(*stage);
  EXPECT_EQ(e["finished"], 8) << e.dump();
  EXPECT_GE(e["max_batch"].get<int64_t>(), 2) << e.dump();
  EXPECT_EQ(e["max_num_seqs"], 4);
}

// B (2 steps) joins A (40 steps) after A's second step, on the other expert at first, and
// leaves while A still runs; both give their frames alone.
TEST(DiffusionBatching, RequestJoinsARunningBatchAndLeavesAtItsEnd) {
  auto stage = batching_stage();
  const auto a = params(0, 40, 5.0), b = params(1, 2, 4.0);
  const Outcome a_alone = run(*stage, a), b_alone = run(*stage, b);
  std::optional<std::thread> joiner;
  Outcome b_together;
  std::atomic<int64_t> a_steps_when_b_ended{0};
  std::atomic<int64_t> a_steps{0};
  const Outcome a_together = run(*stage, a, [&](int64_t step, CancelToken&) {
    a_steps = step;
    if (step == 2) {
      joiner.emplace([&] {
        b_together = run(*stage, b);
        a_steps_when_b_ended = a_steps.load();
      });
    }
  });
  joiner->join();
  ASSERT_FALSE(b_together.error) << b_together.message;
  EXPECT_TRUE(at::equal(a_together.frames, a_alone.frames));
  EXPECT_TRUE(at::equal(b_together.frames, b_alone.frames));
  EXPECT_LT(a_steps_when_b_ended.load(), 40);
  EXPECT_GE(engine(*stage)["max_batch"].get<int64_t>(), 2) << engine(*stage).dump();
}

// B is cancelled after its first step and C asks for a height the VAE cannot take: A, running
// beside them, gives its frames alone; B's and C's errors are theirs.
TEST(DiffusionBatching, CancelledAndBadRequestsLeaveTheOthers) {
  auto stage = batching_stage();
  const auto a = params(0, 6, 5.0), b = params(1, 6, 3.0);
  auto c = params(2, 6, 3.0);
  c.request.height = 17;
  const Outcome a_alone = run(*stage, a);
  std::vector<std::thread> others;
  Outcome b_out, c_out;
  const Outcome a_together = run(*stage, a, [&](int64_t step, CancelToken&) {
    if (step != 1) return;
    others.emplace_back(
        [&] { b_out = run(*stage, b, [](int64_t, CancelToken& cancel) { cancel.cancel(); }); });
    others.emplace_back([&] { c_out = run(*stage, c); });
  });
  for (auto& t : others) t.join();
  ASSERT_FALSE(a_together.error) << a_together.message;
  EXPECT_TRUE(at::equal(a_together.frames, a_alone.frames));
  ASSERT_TRUE(b_out.error);
  EXPECT_EQ(*b_out.error, StageError::Code::kCancelled) << b_out.message;
  EXPECT_FALSE(b_out.frames.defined());
  EXPECT_LT(b_out.steps, 6);
  ASSERT_TRUE(c_out.error);
  EXPECT_EQ(*c_out.error, StageError::Code::kInvalidArgument) << c_out.message;
  EXPECT_NE(c_out.message.find("height"), std::string::npos) << c_out.message;
  // The stage serves the next request as before.
  const Outcome again = run(*stage, a);
  EXPECT_TRUE(at::equal(again.frames, a_alone.frames));
  const Json e = engine(*stage);
  EXPECT_EQ(e["cancelled"], 1) << e.dump();
}

}  // namespace
}  // namespace omni::pipeline
