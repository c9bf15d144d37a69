// Continuous batching on the tiny Qwen3-Omni fixture: requests of every kind (text, audio,
// image; different lengths; a stop string; a seeded sampled one) give the same tokens, codes
// and waveform alone and all at once, the thinkers and the talkers stepping in batches; requests
// join a running batch and leave it (one cancelled mid-batch frees its KV blocks); more requests
// than the KV budget holds wait and all finish with their alone answers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tiny_request.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/pipeline.h"
#include "worker/qwen3_omni/stage_params.h"

namespace omni::pipeline {
namespace {

using testing::omni;

using Json = nlohmann::json;
const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

std::shared_ptr<Stage> local(const std::string& model_stage, int id, EngineLimits limits = {},
                             uint64_t kv_bytes = 0, int64_t kv_block_size = 16) {
  LocalStageOptions o;
  o.name = "stage " + std::to_string(id) + " (" + model_stage + ")";
  o.model_stage = model_stage;
  o.model_dir = kDir;
  o.limits = limits;
  o.kv_cache_memory_bytes = kv_bytes;
  o.kv_block_size = kv_block_size;
  return make_local_stage(o);
}

// Eight requests that differ in every way a batch row can.
std::vector<Request> eight_requests() {
  std::vector<Request> all;
  const char* texts[] = {"What do you hear and see?", "Hi", "Tell me a long story about a fox.",
                         "Why is the sky blue?"};
  for (int i = 0; i < 8; ++i) {
    auto r = testing::tiny_request(kDir, /*media=*/false);
    r.chat.text = texts[i % 4];
    omni(r).sampling.thinker.max_new_tokens = 6 + 2 * i;  // different lengths
    omni(r).max_audio_frames = 6;
    all.push_back(r);
  }
  all[0].chat.audio_files = {kDir + "/audio.wav"};
  all[0].chat.image_files = {kDir + "/image.png"};
  all[1].chat.audio_files = {kDir + "/audio.wav"};
  all[2].chat.image_files = {kDir + "/image.png"};
  all[3].audio_output = false;  // text only
  all[4].chat.system_prompt = "Answer in one word.";
  // A seeded sampled thinker: its own generator, whatever shares its batch.
  omni(all[5]).sampling.thinker.greedy = false;
  omni(all[5]).sampling.thinker.temperature = 0.9;
  omni(all[5]).sampling.thinker.top_k = 20;
  omni(all[5]).sampling.thinker.seed = 11;
  return all;
}

PipelineResult run_alone(Pipeline& pipeline, const Request& r) { return pipeline.generate(r); }

void expect_same(const PipelineResult& alone, const PipelineResult& together, size_t i) {
  SCOPED_TRACE("request " + std::to_string(i));
  EXPECT_EQ(together.tokens, alone.tokens);
  EXPECT_EQ(together.text, alone.text);
  EXPECT_EQ(together.finish_reason, alone.finish_reason);
  ASSERT_EQ(together.audio.codes.defined(), alone.audio.codes.defined());
  if (!alone.audio.codes.defined()) return;
  EXPECT_TRUE(at::equal(together.audio.codes, alone.audio.codes));
  ASSERT_EQ(together.audio.waveform.sizes(), alone.audio.waveform.sizes());
  if (alone.audio.waveform.numel() > 0) {
    EXPECT_LE((together.audio.waveform - alone.audio.waveform).abs().max().item<double>(), 1e-4);
  }
}

Json engine_stats(Stage& stage) { return Json::parse(stage.stats_json())["engine"]; }

TEST(PipelineBatching, EightDifferentRequestsAloneAndTogetherGiveTheSameAnswers) {
  auto thinker = local("thinker", 0);
  auto talker = local("talker", 1);
  auto code2wav = local("code2wav", 2);
  Pipeline pipeline(
      {{0, "thinker", {}, thinker}, {1, "talker", {0}, talker}, {2, "code2wav", {1}, code2wav}});
  auto requests = eight_requests();
  std::vector<PipelineResult> alone;
  for (const auto& r : requests) alone.push_back(run_alone(pipeline, r));
  // A stop string from request 2's own answer: an ASCII letter first seen inside it.
  std::string stop;
  for (size_t i = 1; i < alone[2].text.size() && stop.empty(); ++i) {
    const char c = alone[2].text[i];
    if (std::isalpha(static_cast<unsigned char>(c)) && alone[2].text.find(c) == i) stop = {c};
  }
  ASSERT_FALSE(stop.empty()) << alone[2].text;
  requests[6] = requests[2];
  requests[6].stop_strings = {stop};
  alone[6] = run_alone(pipeline, requests[6]);
  EXPECT_EQ(alone[6].finish_reason, "stop");
  const int64_t steps_before = engine_stats(*thinker)["steps"].get<int64_t>();
  const int64_t first_chunks_before =
      engine_stats(*code2wav)["first_audio_forwards"].get<int64_t>();

  std::vector<PipelineResult> together(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] { together[i] = pipeline.generate(requests[i]); });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < requests.size(); ++i) expect_same(alone[i], together[i], i);

  // They shared batches: fewer steps than tokens, and more than one row at once.
  const Json e = engine_stats(*thinker);
  EXPECT_GE(e["max_batch"].get<int64_t>(), 2);
  int64_t tokens = 0;
  for (const auto& r : together) tokens += static_cast<int64_t>(r.tokens.size());
  EXPECT_LT(e["steps"].get<int64_t>() - steps_before, tokens);
  EXPECT_EQ(e["running"].get<int64_t>(), 0);
  EXPECT_EQ(e["kv_blocks_reserved"].get<int64_t>(), 0);
  // The talkers stepped together too.
  const Json t = Json::parse(talker->stats_json())["engine"];
  EXPECT_GE(t["max_batch"].get<int64_t>(), 2) << t.dump();
  EXPECT_EQ(t["running"].get<int64_t>(), 0) << t.dump();
  // Each answer's first streamed chunk decoded at once, alone (the weights are resident), and
  // the later chunks on the lower-priority thread.
  int64_t speaking = 0;
  for (const auto& r : together) {
    speaking += r.audio.codes.defined() && r.audio.codes.numel() > 0 ? 1 : 0;
  }
  ASSERT_GT(speaking, 0);
  const Json c = engine_stats(*code2wav);
  EXPECT_EQ(c["first_audio_forwards"].get<int64_t>() - first_chunks_before, speaking) << c.dump();
  EXPECT_TRUE(c["batches_in_background"].get<bool>()) << c.dump();
  // On the CPU one window a forward: batching windows there costs more than it saves.
  EXPECT_EQ(c["windows_per_forward"].get<int64_t>(), 1) << c.dump();
  EXPECT_EQ(c["max_batch"].get<int64_t>(), 1) << c.dump();
}

// The thinker stage alone, called as the orchestrator calls it.
struct ThinkerCall {
  std::vector<int64_t> tokens;
  std::string finish_reason;
  std::string error;
  int64_t prompt_tokens = 0;
};

ThinkerCall call_thinker(Stage& stage, const std::string& text, int64_t max_new_tokens,
                         const CancelToken& cancel = {}, int cancel_after = -1,
                         CancelToken* to_cancel = nullptr) {
  auto params = std::make_shared<ThinkerParams>();
  params->text = text;
  params->sampling.greedy = true;
  params->sampling.max_new_tokens = max_new_tokens;
  params->sampling.stop_token_ids = {-1};  // runs its full length
  StageCall call;
  call.request_id = text;
  call.params = params;
  PacketQueue input;
  input.close();
  ThinkerCall out;
  int packets = 0;
  try {
    stage.run(
        call, input,
        [&](StagePacket&& p) {
          out.tokens.insert(out.tokens.end(), p.tokens.begin(), p.tokens.end());
          if (p.finished) {
            out.finish_reason = p.finish_reason;
            out.prompt_tokens = static_cast<int64_t>(p.metrics.at("prompt_tokens"));
          }
          if (++packets == cancel_after) to_cancel->cancel();
        },
        cancel);
  } catch (const StageError& e) {
    out.error = code_name(e.code());
  }
  return out;
}

// Prompts run in chunks of 7 tokens (cutting through the audio and image placeholders and the
// DeepStack rows among them) beside decoding requests: the eight requests (greedy, seeded, with
// media, with a talker reading the hand-off rows) get the whole prefill's answers, alone and
// together.
TEST(PipelineBatching, ChunkedPrefillGivesTheWholePrefillsAnswers) {
  auto whole = local("thinker", 0);
  auto talker = local("talker", 1);
  auto code2wav = local("code2wav", 2);
  EngineLimits limits{8, 7, 64};
  limits.chunked_prefill = true;
  auto chunked = local("thinker", 0, limits);
  Pipeline by_whole(
      {{0, "thinker", {}, whole}, {1, "talker", {0}, talker}, {2, "code2wav", {1}, code2wav}});
  Pipeline by_chunks(
      {{0, "thinker", {}, chunked}, {1, "talker", {0}, talker}, {2, "code2wav", {1}, code2wav}});
  const auto requests = eight_requests();
  std::vector<PipelineResult> expected;
  for (const auto& r : requests) {
    expected.push_back(by_whole.generate(r));
    expect_same(expected.back(), by_chunks.generate(r), expected.size() - 1);
  }
  const Json alone = engine_stats(*chunked);
  EXPECT_TRUE(alone["chunked_prefill"].get<bool>());
  // Every prompt ran in chunks of at most 7 tokens.
  EXPECT_GE(alone["prefill_chunks"].get<int64_t>(),
            (alone["prefill_tokens"].get<int64_t>() + 6) / 7);
  EXPECT_GT(alone["prefill_chunks"].get<int64_t>(), 8 * 2) << alone.dump();

  std::vector<PipelineResult> together(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] { together[i] = by_chunks.generate(requests[i]); });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < requests.size(); ++i) expect_same(expected[i], together[i], i);
  const Json e = engine_stats(*chunked);
  EXPECT_GE(e["max_batch"].get<int64_t>(), 2) << e.dump();
  EXPECT_EQ(e["running"].get<int64_t>(), 0) << e.dump();
}

// Each of `texts` alone (greedy, `tokens` long) with blocks of `block` tokens: the calls, the
// bytes of a block, and the most blocks one of them takes (prompt and answer).
struct AloneInBlocks {
  std::vector<ThinkerCall> calls;
  uint64_t block_bytes = 0;
  int64_t worst = 0;
};
AloneInBlocks alone_in_blocks(const std::vector<std::string>& texts, int64_t tokens,
                              int64_t block) {
  auto probe = local("thinker", 0, EngineLimits{8, 8192, 64}, 0, block);
  AloneInBlocks a;
  a.block_bytes = engine_stats(*probe)["kv_block_bytes"].get<uint64_t>();
  for (const auto& t : texts) {
    a.calls.push_back(call_thinker(*probe, t, tokens));
    a.worst = std::max(a.worst, (a.calls.back().prompt_tokens + tokens + block - 1) / block);
  }
  return a;
}

// Each of `texts` on `stage` at once, from a thread of its own.
std::vector<ThinkerCall> call_together(Stage& stage, const std::vector<std::string>& texts,
                                       int64_t tokens) {
  std::vector<ThinkerCall> together(texts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < texts.size(); ++i) {
    clients.emplace_back([&, i] { together[i] = call_thinker(stage, texts[i], tokens); });
  }
  for (auto& c : clients) c.join();
  return together;
}

void expect_alone_tokens(const std::vector<ThinkerCall>& together,
                         const std::vector<ThinkerCall>& alone) {
  ASSERT_EQ(together.size(), alone.size());
  for (size_t i = 0; i < together.size(); ++i) {
    EXPECT_EQ(together[i].error, "") << i;
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  }
}

// In a KV pool, a prompt that runs in chunks holds the blocks of its whole prompt from its
// admission: requests that decode beside it never take them, and every request gets the tokens
// it gets alone.
TEST(PipelineBatching, ChunkedPrefillInAFullKvPoolGivesTheAloneTokens) {
  const std::vector<std::string> texts = {"The first request runs long.",
                                          "A second one starts beside it.",
                                          "And a third one, with a longer prompt than the others."};
  const int64_t tokens = 96, block = 4;
  const AloneInBlocks a = alone_in_blocks(texts, tokens, block);
  EngineLimits limits{8, 5, 64};
  limits.chunked_prefill = true;
  auto thinker =
      local("thinker", 0, limits, static_cast<uint64_t>(a.worst + 6) * a.block_bytes, block);
  expect_alone_tokens(call_together(*thinker, texts, tokens), a.calls);
  const Json e = engine_stats(*thinker);
  EXPECT_EQ(e["kv_resumed"].get<int64_t>(), e["kv_preemptions"].get<int64_t>()) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_reallocations"].get<int64_t>(), 0) << e.dump();
}

TEST(PipelineBatching, RequestsJoinAndLeaveARunningBatchAndACancelFreesItsBlocks) {
  auto thinker = local("thinker", 0, EngineLimits{4, 8192, 64});
  // a runs long enough (160 tokens) that c and b, started after it, overlap it even when the
  // machine is loaded (at 40 tokens a loaded CI machine once let a finish before they joined).
  const auto a_alone = call_thinker(*thinker, "The first request runs long.", 160);
  const auto b_alone = call_thinker(*thinker, "A second one joins it.", 12);
  ASSERT_EQ(a_alone.tokens.size(), 160u);

  CancelToken cancel_c;
  ThinkerCall a, b, c;
  std::thread ta([&] { a = call_thinker(*thinker, "The first request runs long.", 160); });
  // c starts beside a and is cancelled after 3 tokens; b joins while a decodes.
  std::thread tc(
      [&] { c = call_thinker(*thinker, "This one is cancelled.", 200, cancel_c, 3, &cancel_c); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread tb([&] { b = call_thinker(*thinker, "A second one joins it.", 12); });
  tc.join();
  EXPECT_EQ(c.error, "cancelled");
  // At the next step its blocks are free: what is reserved then is a's and b's alone.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Json e;
  do {
    e = engine_stats(*thinker);
  } while (e["cancelled"].get<int64_t>() < 1 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(e["cancelled"].get<int64_t>(), 1);
  ta.join();
  tb.join();
  EXPECT_EQ(a.tokens, a_alone.tokens);
  EXPECT_EQ(b.tokens, b_alone.tokens);
  e = engine_stats(*thinker);
  EXPECT_EQ(e["kv_blocks_reserved"].get<int64_t>(), 0);
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0);
  EXPECT_GE(e["max_batch"].get<int64_t>(), 2);
}

// Eight requests decoding 2,048 tokens each in one batch, their KV caches in the pool the stage
// allocated when it started: no cache is reallocated and no history copied, the device holds the
// weights and the pool throughout, and every block comes back. Without a pool the same caches
// grow by copying (the counter can tell the two apart).
TEST(PipelineBatching, ALongBatchedDecodeInTheKvPoolNeverReallocates) {
  const std::vector<std::string> texts = {"one",       "two two", "three three three", "four",
                                          "five five", "six",     "seven seven",       "eight"};
  auto growable = local("thinker", 0, EngineLimits{8, 8192, 64});
  std::vector<std::thread> clients;
  for (const auto& t : texts) {
    clients.emplace_back([&, t] { EXPECT_EQ(call_thinker(*growable, t, 48).error, ""); });
  }
  for (auto& c : clients) c.join();
  clients.clear();
  const Json g = engine_stats(*growable);
  EXPECT_GE(g["kv_reallocations"].get<int64_t>(), 8 * 2) << g.dump();
  EXPECT_GT(g["kv_bytes_copied"].get<uint64_t>(), 0u) << g.dump();
  const auto block_bytes = g["kv_block_bytes"].get<uint64_t>();
  const uint64_t weights_only = growable->info().device_weight_bytes;
  growable.reset();

  const int64_t tokens = 2048, blocks = 8 * ((64 + tokens + 15) / 16);
  auto thinker =
      local("thinker", 0, EngineLimits{8, 8192, 64}, static_cast<uint64_t>(blocks) * block_bytes);
  EXPECT_EQ(engine_stats(*thinker)["kv_pool_bytes"].get<uint64_t>(),
            static_cast<uint64_t>(blocks) * block_bytes);
  std::vector<ThinkerCall> calls(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    clients.emplace_back([&, i] { calls[i] = call_thinker(*thinker, texts[i], tokens); });
  }
  // While all eight run: blocks in use, and the device bytes they end with.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Json e;
  do {
    e = engine_stats(*thinker);
  } while (e["running"].get<int64_t>() < 8 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(e["running"].get<int64_t>(), 8);
  EXPECT_GT(e["kv_blocks_used"].get<int64_t>(), 0);
  const uint64_t device_while_running = thinker->device_bytes();
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(calls[i].error, "") << i;
    EXPECT_EQ(calls[i].tokens.size(), static_cast<size_t>(tokens)) << i;
  }
  e = engine_stats(*thinker);
  EXPECT_EQ(e["max_batch"].get<int64_t>(), 8) << e.dump();
  EXPECT_EQ(e["kv_reallocations"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_bytes_copied"].get<uint64_t>(), 0u) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(thinker->device_bytes(), device_while_running);
  EXPECT_EQ(thinker->info().device_weight_bytes, weights_only);
  EXPECT_EQ(thinker->info().device_kv_bytes, static_cast<uint64_t>(blocks) * block_bytes);
  // Leaving the device, the stage frees its pool with its weights; the next request brings both
  // back and is answered as before.
  const uint64_t pool_bytes = static_cast<uint64_t>(blocks) * block_bytes;
  EXPECT_GE(thinker->set_device_released(true), pool_bytes);
  EXPECT_LE(thinker->device_bytes(), device_while_running - pool_bytes);
  const auto again = call_thinker(*thinker, texts[0], 8);
  EXPECT_EQ(again.error, "");
  EXPECT_EQ(again.tokens,
            std::vector<int64_t>(calls[0].tokens.begin(), calls[0].tokens.begin() + 8));
  EXPECT_EQ(thinker->device_bytes(), device_while_running);
}

// Two requests of 256 tokens in a pool of blocks of 4 tokens that holds one of them and a little
// more: both are admitted by the blocks their prompts take, the pool runs dry as they grow, the
// later one is preempted (its blocks go back), the first finishes, and the later one resumes by
// prefilling what it had cached: each ends with the tokens it gets alone.
TEST(PipelineBatching, FillingTheKvPoolPreemptsAndResumesWithTheAloneTokens) {
  const std::vector<std::string> texts = {"The first request runs long.",
                                          "A second one starts beside it."};
  const int64_t tokens = 256, block = 4;
  const AloneInBlocks a = alone_in_blocks(texts, tokens, block);
  const int64_t total = a.worst + 8;  // one request's worst case and 8 blocks more
  auto thinker = local("thinker", 0, EngineLimits{8, 8192, 64},
                       static_cast<uint64_t>(total) * a.block_bytes, block);
  expect_alone_tokens(call_together(*thinker, texts, tokens), a.calls);
  const Json e = engine_stats(*thinker);
  EXPECT_EQ(e["max_batch"].get<int64_t>(), 2) << e.dump();  // both ran at once
  EXPECT_GE(e["kv_preemptions"].get<int64_t>(), 1) << e.dump();
  EXPECT_EQ(e["kv_resumed"].get<int64_t>(), e["kv_preemptions"].get<int64_t>()) << e.dump();
  EXPECT_EQ(e["kv_reallocations"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();
}

// Clients submit and cancel at once while the pool runs dry: some requests
// are preempted, some cancelled while running, waiting or preempted; the others get the tokens
// they get alone, and every block goes back.
TEST(PipelineBatching, ConcurrentSubmitCancelAndPreemptionLeaveNoBlockBehind) {
  const std::vector<std::string> texts = {
      "one two three", "four five", "six", "seven eight", "nine ten eleven twelve", "thirteen"};
  const int64_t tokens = 64, block = 4;
  const AloneInBlocks a = alone_in_blocks(texts, tokens, block);
  EngineLimits limits{8, 16, 64};
  limits.chunked_prefill = true;
  auto thinker =
      local("thinker", 0, limits, static_cast<uint64_t>(a.worst + 4) * a.block_bytes, block);
  std::vector<ThinkerCall> got(texts.size());
  std::vector<CancelToken> cancels(texts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < texts.size(); ++i) {
    // Every other request cancels itself after a few tokens (or while it waits).
    const int after = i % 2 == 1 ? 3 + static_cast<int>(i) : -1;
    clients.emplace_back([&, i, after] {
      got[i] = call_thinker(*thinker, texts[i], tokens, cancels[i], after, &cancels[i]);
    });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i % 2 == 1) {
      EXPECT_EQ(got[i].error, "cancelled") << i;
    } else {
      EXPECT_EQ(got[i].error, "") << i;
      EXPECT_EQ(got[i].tokens, a.calls[i].tokens) << i;
    }
  }
  const Json e = engine_stats(*thinker);
  EXPECT_EQ(e["running"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_reserved"].get<int64_t>(), 0) << e.dump();
  EXPECT_LE(e["kv_resumed"].get<int64_t>(), e["kv_preemptions"].get<int64_t>()) << e.dump();
  EXPECT_EQ(e["cancelled"].get<int64_t>(), 3) << e.dump();
}

TEST(PipelineBatching, MoreRequestsThanTheKvBudgetHoldsWaitAndAllFinish) {
  // Room for two requests' prompt and answer at a time (blocks of 16 tokens): the others wait
  // for blocks (or are preempted and resume), none fails and each gets its alone tokens.
  auto probe = local("thinker", 0);
  const Json p = engine_stats(*probe);
  const auto block_bytes = p["kv_block_bytes"].get<uint64_t>();
  const uint64_t weights_only = probe->info().device_weight_bytes;
  const std::vector<std::string> texts = {"one",  "two two",   "three three three",
                                          "four", "five five", "six"};
  std::vector<ThinkerCall> alone;
  for (const auto& t : texts) alone.push_back(call_thinker(*probe, t, 16));
  probe.reset();

  // Blocks of 16 tokens; the largest request's worst case twice over: at least two run at once,
  // never all six.
  int64_t need_max = 0;
  for (const auto& a : alone) need_max = std::max(need_max, (a.prompt_tokens + 16 + 15) / 16);
  const int64_t total = 2 * need_max;
  auto thinker =
      local("thinker", 0, EngineLimits{8, 8192, 64}, static_cast<uint64_t>(total) * block_bytes);
  EXPECT_EQ(engine_stats(*thinker)["kv_blocks_total"].get<int64_t>(), total);
  // The device ledger counts the KV pool beside the weights (co-located stages share the
  // budget), as a line of its own.
  EXPECT_EQ(thinker->info().device_weight_bytes, weights_only);
  EXPECT_EQ(thinker->info().device_kv_bytes, static_cast<uint64_t>(total) * block_bytes);
  config::PipelineConfig budgeted;
  budgeted.stages.emplace_back();
  budgeted.stages[0].runtime.devices = "cpu";
  budgeted.stages[0].engine.gpu_memory_budget = 1ull << 40;
  const auto ledger = Json::parse(make_device_ledger(budgeted, {thinker})->stats_json());
  const Json& line = ledger["local/cpu"]["stages"][thinker->name()];
  EXPECT_EQ(line["kv_bytes"].get<uint64_t>(), static_cast<uint64_t>(total) * block_bytes);
  EXPECT_EQ(line["weight_bytes"].get<uint64_t>(), weights_only) << line.dump();
  EXPECT_EQ(line["bytes"].get<uint64_t>(),
            weights_only + static_cast<uint64_t>(total) * block_bytes);
  std::vector<ThinkerCall> together(texts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < texts.size(); ++i) {
    clients.emplace_back([&, i] { together[i] = call_thinker(*thinker, texts[i], 16); });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(together[i].error, "") << i;
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  }
  const Json e = engine_stats(*thinker);
  EXPECT_LE(e["max_batch"].get<int64_t>(), total);  // each running request holds a block
  EXPECT_LT(e["max_batch"].get<int64_t>(), static_cast<int64_t>(texts.size()));
  EXPECT_EQ(e["kv_preemptions"].get<int64_t>(), e["kv_resumed"].get<int64_t>());
  EXPECT_EQ(e["finished"].get<int64_t>(), static_cast<int64_t>(texts.size()));
  EXPECT_EQ(e["kv_blocks_reserved"].get<int64_t>(), 0);

  // One request larger than the whole cache is refused with a clear error, not left waiting.
  const auto huge = call_thinker(*thinker, "too long", 500);
  EXPECT_EQ(huge.error, "invalid_argument");
}

// The talker's KV in a pool of its own, blocks of 4 tokens: the eight requests together give
// the answers they give alone with growing caches, nothing is reallocated and every block goes
// back. A pool that holds about one request's longest run (its prompt and every frame) makes the
// others wait for their prefill instead of preempting them, with the same answers; a request
// whose longest run exceeds the pool is refused, naming the blocks, and the stage still serves.
TEST(PipelineBatching, TheTalkersKvPoolGivesTheSameAnswersAndWaitsWhenFull) {
  auto thinker = local("thinker", 0);
  auto code2wav = local("code2wav", 2);
  const auto pipeline_with = [&](std::shared_ptr<Stage> talker) {
    return std::make_unique<Pipeline>(std::vector<PipelineStage>{
        {0, "thinker", {}, thinker}, {1, "talker", {0}, talker}, {2, "code2wav", {1}, code2wav}});
  };
  auto growable = local("talker", 1, {}, 0, 4);
  const auto requests = eight_requests();
  std::vector<PipelineResult> alone;
  int64_t longest_prompt = 0;
  {
    auto reference = pipeline_with(growable);
    for (const auto& r : requests) {
      alone.push_back(reference->generate(r));
      longest_prompt = std::max<int64_t>(
          longest_prompt,
          static_cast<int64_t>(
              alone.back().stage_metrics.at("stage 0 (thinker)").at("prompt_tokens")));
    }
  }
  const Json g = engine_stats(*growable);
  EXPECT_GE(g["kv_reallocations"].get<int64_t>(), 1) << g.dump();  // what the pool avoids
  const auto block_bytes = g["kv_block_bytes"].get<uint64_t>();
  const auto together = [&](Pipeline& pipeline) {
    std::vector<PipelineResult> got(requests.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] { got[i] = pipeline.generate(requests[i]); });
    }
    for (auto& c : clients) c.join();
    for (size_t i = 0; i < requests.size(); ++i) expect_same(alone[i], got[i], i);
  };

  const uint64_t roomy = 256 * block_bytes;
  auto pooled = local("talker", 1, {}, roomy, 4);
  together(*pipeline_with(pooled));
  Json e = engine_stats(*pooled);
  EXPECT_GE(e["max_batch"].get<int64_t>(), 2) << e.dump();
  EXPECT_EQ(e["kv_pool_bytes"].get<uint64_t>(), roomy) << e.dump();
  EXPECT_EQ(e["kv_reallocations"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_reserved"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(pooled->info().device_kv_bytes, roomy);

  // The talker's prompt is the thinker's and a few rows of the answer; 7 frames at most.
  const int64_t one_run = (longest_prompt + 16 + 7 + 3) / 4;
  auto tight = local("talker", 1, {}, static_cast<uint64_t>(one_run) * block_bytes, 4);
  auto full = pipeline_with(tight);
  together(*full);
  e = engine_stats(*tight);
  EXPECT_GE(e["kv_admission_waits"].get<int64_t>(), 1) << e.dump();
  EXPECT_EQ(e["kv_preemptions"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_reallocations"].get<int64_t>(), 0) << e.dump();
  EXPECT_EQ(e["kv_blocks_used"].get<int64_t>(), 0) << e.dump();

  auto tiny = local("talker", 1, {}, 2 * block_bytes, 4);
  auto refusing = pipeline_with(tiny);
  try {
    refusing->generate(requests[0]);
    ADD_FAILURE() << "a request longer than the talker's KV pool was answered";
  } catch (const StageError& err) {
    EXPECT_EQ(err.stage(), "stage 1 (talker)");
    EXPECT_NE(std::string(err.what()).find("KV blocks"), std::string::npos) << err.what();
  }
  auto text_only = requests[0];
  text_only.audio_output = false;
  EXPECT_EQ(refusing->generate(text_only).tokens, alone[0].tokens);
}

}  // namespace
}  // namespace omni::pipeline
