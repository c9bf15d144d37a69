// Batched decode on the tiny checkpoint: sequences of different prompts and lengths stepped
// together (Thinker::decode_batch, Talker::step_batch with its code predictor) give, row by
// row, the logits of the same sequence run alone (within 1e-5: the batch's matrix products may
// round differently) and so the same greedy tokens and codes; the smallest decision margin of
// the prompts is recorded.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/generation/token_sequence.h"
#include "model_runner/kv/kv_block_pool.h"
#include "model_runner/qwen3_omni/code2wav_windows.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

std::vector<qwen3_omni::ThinkerInputs> prompts(const ThinkerRunner& runner) {
  std::vector<qwen3_omni::ThinkerInputs> all;
  for (const char* text :
       {"Hello!", "The quick brown fox jumps over the lazy dog. Hello, world!",
        "Count: one, two, three, four, five, six, seven, eight, nine, ten.", "Why?"}) {
    ChatRequest request;
    request.text = text;
    all.push_back(runner.prepare(request));
  }
  // The multimodal prompt of the reference (audio and image placeholders, DeepStack).
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  qwen3_omni::ThinkerInputs mm;
  const auto ids = ref.tensor("mm_input_ids").contiguous();
  mm.input_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  mm.audio_features = ref.tensor("input_features");
  mm.audio_lengths = {mm.audio_features.size(1)};
  mm.pixel_values = ref.tensor("pixel_values");
  const auto grid = ref.tensor("image_grid_thw").contiguous();
  mm.image_grids = {
      {grid[0][0].item<int64_t>(), grid[0][1].item<int64_t>(), grid[0][2].item<int64_t>()}};
  all.push_back(mm);
  return all;
}

SamplingParams greedy(int64_t max_new_tokens) {
  SamplingParams p;
  p.greedy = true;
  p.max_new_tokens = max_new_tokens;
  p.stop_token_ids = {-1};  // a fixed length: every row runs every step
  return p;
}

// Top-1 minus top-2 logit: how far a greedy decision is from flipping.
double margin(const at::Tensor& logits) {
  const auto top = std::get<0>(at::topk(logits.reshape({-1}), 2));
  return (top[0] - top[1]).item<double>();
}

// Each prompt prefilled and decoded by itself: its logits per step and its tokens.
struct Alone {
  std::vector<std::vector<at::Tensor>> logits;
  std::vector<std::vector<int64_t>> tokens;
  double smallest_margin = 1e9;
};

Alone decode_alone(qwen3_omni::Thinker& thinker,
                   const std::vector<qwen3_omni::ThinkerInputs>& inputs, int64_t steps) {
  Alone alone;
  alone.logits.resize(inputs.size());
  for (const auto& input : inputs) {
    auto state = thinker.new_state();
    TokenSequence seq(greedy(steps), input.input_ids);
    at::Tensor logits = thinker.prefill(input, state)[0];
    auto& mine = alone.logits[alone.tokens.size()];
    while (true) {
      mine.push_back(logits);
      alone.smallest_margin = std::min(alone.smallest_margin, margin(logits));
      const int64_t token = seq.sample(logits);
      if (seq.finished()) break;
      logits = thinker.decode(token, state);
    }
    alone.tokens.push_back(seq.tokens());
  }
  return alone;
}

// The same prompts decoded together: rows join at different steps (prefilled one after the
// other as an engine admits them) and decode in one batch; with `pool`, their KV caches take
// its blocks.
struct Together {
  std::vector<std::vector<int64_t>> tokens;
  double worst = 0;  // the largest logit difference from alone
  int64_t largest_batch = 0;
  size_t most_runs = 0;       // of any row's KV cache
  int64_t reallocations = 0;  // of all rows' KV caches
  int64_t blocks_at_end = 0;  // the rows' blocks of the pool, before the rows end
  int64_t blocks_needed = 0;  // blocks the rows' lengths take
};

Together decode_together(qwen3_omni::Thinker& thinker,
                         const std::vector<qwen3_omni::ThinkerInputs>& inputs, int64_t steps,
                         const Alone& alone, const std::shared_ptr<KvBlockPool>& pool = nullptr) {
  Together out;
  std::vector<qwen3_omni::ThinkerState> states;
  std::vector<TokenSequence> seqs;
  states.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    states.push_back(thinker.new_state());
    if (pool) states.back().cache.use_pool(pool);
    seqs.emplace_back(greedy(steps), inputs[i].input_ids);
  }
  std::vector<at::Tensor> next(inputs.size());
  std::vector<size_t> step(inputs.size(), 0);
  size_t admitted = 0;
  while (true) {
    if (admitted < inputs.size()) {  // one new row per step
      next[admitted] = thinker.prefill(inputs[admitted], states[admitted])[0];
      ++admitted;
    }
    std::vector<int64_t> tokens;
    std::vector<qwen3_omni::ThinkerState*> rows;
    std::vector<size_t> which;
    for (size_t i = 0; i < admitted; ++i) {
      if (seqs[i].finished()) continue;
      out.worst =
          std::max(out.worst, (next[i] - alone.logits[i][step[i]]).abs().max().item<double>());
      ++step[i];
      const int64_t token = seqs[i].sample(next[i]);
      if (seqs[i].finished()) continue;
      tokens.push_back(token);
      rows.push_back(&states[i]);
      which.push_back(i);
    }
    if (rows.empty() && admitted == inputs.size()) break;
    if (rows.empty()) continue;
    out.largest_batch = std::max<int64_t>(out.largest_batch, static_cast<int64_t>(rows.size()));
    const auto logits = thinker.decode_batch(tokens, rows);
    EXPECT_EQ(logits.size(0), static_cast<int64_t>(rows.size()));
    for (size_t r = 0; r < which.size(); ++r) next[which[r]] = logits[static_cast<int64_t>(r)];
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    out.tokens.push_back(seqs[i].tokens());
    out.most_runs = std::max(out.most_runs, states[i].cache.runs().size());
    out.reallocations += states[i].cache.reallocations();
    if (pool) out.blocks_needed += states[i].cache.blocks_for(states[i].cache.length());
  }
  if (pool) out.blocks_at_end = pool->blocks_in_use();
  return out;
}

// The tiny thinker with its prompts, each decoded `steps` tokens alone; no autograd, and the
// weights held in place, for the test's whole life.
struct TinyThinker {
  explicit TinyThinker(int64_t decode_steps)
      : runner(ThinkerRunner::load(options(), offload::make_cpu_sim_engine({}))),
        scope(runner->offload().forward_scope()),
        inputs(prompts(*runner)),
        steps(decode_steps),
        alone(decode_alone(runner->model(), inputs, steps)) {}
  static ThinkerRunnerOptions options() {
    ThinkerRunnerOptions o;
    o.model_dir = kDir;
    return o;
  }
  qwen3_omni::Thinker& thinker() { return runner->model(); }

  at::NoGradGuard no_grad;
  std::unique_ptr<ThinkerRunner> runner;
  offload::OffloadBackend::ForwardScope scope;
  std::vector<qwen3_omni::ThinkerInputs> inputs;
  int64_t steps;
  Alone alone;
};

TEST(Qwen3OmniBatch, BatchedDecodeGivesEachRowItsAloneLogitsAndTokens) {
  TinyThinker tiny(12);
  const auto& inputs = tiny.inputs;
  const Alone& alone = tiny.alone;
  const Together together = decode_together(tiny.thinker(), inputs, tiny.steps, alone);
  EXPECT_EQ(together.largest_batch, static_cast<int64_t>(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(together.tokens[i], alone.tokens[i]) << "prompt " << i;
  }
  RecordProperty("max_abs_logit_diff", std::to_string(together.worst));
  RecordProperty("smallest_greedy_margin", std::to_string(alone.smallest_margin));
  std::cout << "batched vs alone: max abs logit diff " << together.worst
            << ", smallest greedy margin " << alone.smallest_margin << "\n";
  EXPECT_LE(together.worst, 1e-5);
  EXPECT_GT(alone.smallest_margin, 1e-5);  // so that equal tokens are not luck
}

// The same batch with every KV cache in one block pool of exactly the blocks the rows end with:
// the rows' blocks interleave, so some row's history lies in runs that are not adjacent, which
// attention reads where they lie. Logits within 1e-5 of alone, the same tokens, no cache
// reallocated.
TEST(Qwen3OmniBatch, RowsWhoseKvBlocksAreNotAdjacentGiveTheirAloneTokens) {
  TinyThinker tiny(12);
  const auto& inputs = tiny.inputs;
  const Alone& alone = tiny.alone;
  const int64_t block = 4;
  int64_t blocks = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    // The cache holds the prompt and every token but the last (never fed back).
    const auto length =
        static_cast<int64_t>(inputs[i].input_ids.size() + alone.tokens[i].size()) - 1;
    blocks += (length + block - 1) / block;
  }
  const auto shape = qwen3_omni::kv_pool_shape(tiny.thinker().config().text, tiny.runner->dtype(),
                                               tiny.thinker().device(), block, blocks);
  auto pool = std::make_shared<KvBlockPool>(shape);
  const Together together = decode_together(tiny.thinker(), inputs, tiny.steps, alone, pool);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(together.tokens[i], alone.tokens[i]) << "prompt " << i;
  }
  std::cout << "pooled batch vs alone: max abs logit diff " << together.worst << ", most runs "
            << together.most_runs << "\n";
  EXPECT_LE(together.worst, 1e-5);
  EXPECT_GT(together.most_runs, 1u) << "the test needs a row whose blocks are not adjacent";
  EXPECT_EQ(together.reallocations, 0);
  EXPECT_EQ(together.blocks_at_end, shape.num_blocks);
  EXPECT_EQ(together.blocks_needed, shape.num_blocks);
  EXPECT_EQ(pool->blocks_in_use(), 0);  // the rows ended and gave their blocks back
}

// The talker fed the reference's three prefills (text, audio, image prompts: different lengths),
// the second and third joining after the first has spoken some frames, each step feeding back
// the reference's code 0: frames equal to the reference's and logits within 1e-5 of alone.
TEST(Qwen3OmniBatch, BatchedTalkerStepsGiveEachRowItsAloneFramesAndLogits) {
  SpeechRunnerOptions options;
  options.model_dir = kDir;
  auto runner = TalkerRunner::load(options, offload::make_cpu_sim_engine({}));
  auto& talker = runner->model();
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  at::NoGradGuard no_grad;
  const std::vector<std::string> names = {"speech_text", "speech_audio", "speech_image"};
  auto prefill = [&](const std::string& name, qwen3_omni::TalkerState& state) {
    qwen3_omni::Talker::ProjectedPrompt prompt;
    prompt.embeds = ref.tensor(name + "_talker_input_embeds");
    prompt.trailing = ref.tensor(name + "_trailing_text");
    prompt.tts_pad = ref.tensor("tts_pad_embed");
    std::vector<std::array<int64_t, 3>> grids;
    if (name == "speech_image") {
      const auto g = ref.tensor("image_grid_thw").contiguous();
      grids = {{g[0][0].item<int64_t>(), g[0][1].item<int64_t>(), g[0][2].item<int64_t>()}};
    }
    const auto ids = ref.tensor(name + "_talker_input_ids").contiguous();
    return talker.prefill_embeds(
        prompt,
        std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()), grids,
        state);
  };
  SamplingParams greedy_params;
  greedy_params.greedy = true;
  // Alone: each prompt's logits per step.
  std::vector<std::vector<at::Tensor>> alone(names.size());
  std::vector<at::Tensor> codes;
  for (size_t i = 0; i < names.size(); ++i) {
    codes.push_back(ref.tensor(names[i] + "_codes").contiguous());
    auto state = talker.new_state();
    Sampler sampler(greedy_params);
    at::Tensor logits = prefill(names[i], state);
    for (int64_t t = 0; t < codes[i].size(1); ++t) {
      alone[i].push_back(logits);
      talker.step(codes[i][0][t].item<int64_t>(), state, sampler, logits);
    }
  }
  // Together: row i joins at step 2 * i.
  std::vector<qwen3_omni::TalkerState> states;
  std::vector<Sampler> samplers;
  states.reserve(names.size());
  samplers.reserve(names.size());
  std::vector<at::Tensor> next(names.size());
  std::vector<int64_t> t(names.size(), 0);
  double worst = 0;
  int64_t largest_batch = 0;
  for (int64_t step = 0;; ++step) {
    if (step % 2 == 0 && states.size() < names.size()) {
      states.push_back(talker.new_state());
      samplers.emplace_back(greedy_params);
      next[states.size() - 1] = prefill(names[states.size() - 1], states.back());
    }
    std::vector<int64_t> codes0;
    std::vector<qwen3_omni::TalkerState*> rows;
    std::vector<Sampler*> row_samplers;
    std::vector<size_t> which;
    for (size_t i = 0; i < states.size(); ++i) {
      if (t[i] >= codes[i].size(1)) continue;
      worst = std::max(worst, (next[i] - alone[i][t[i]]).abs().max().item<double>());
      codes0.push_back(codes[i][0][t[i]].item<int64_t>());
      rows.push_back(&states[i]);
      row_samplers.push_back(&samplers[i]);
      which.push_back(i);
    }
    if (rows.empty()) {
      if (states.size() == names.size()) break;
      continue;
    }
    largest_batch = std::max<int64_t>(largest_batch, static_cast<int64_t>(rows.size()));
    at::Tensor logits;
    const auto frames = talker.step_batch(codes0, rows, row_samplers, logits);
    for (size_t r = 0; r < which.size(); ++r) {
      const size_t i = which[r];
      for (int64_t q = 0; q < codes[i].size(0); ++q) {
        ASSERT_EQ(frames[r][q], codes[i][q][t[i]].item<int64_t>())
            << names[i] << " frame " << t[i] << " group " << q;
      }
      next[i] = logits[static_cast<int64_t>(r)];
      ++t[i];
    }
  }
  EXPECT_EQ(largest_batch, static_cast<int64_t>(names.size()));
  RecordProperty("talker_max_abs_logit_diff", std::to_string(worst));
  std::cout << "batched talker vs alone: max abs logit diff " << worst << "\n";
  EXPECT_LE(worst, 1e-5);
}

// Eight requests' code2wav windows (first chunks, later chunks with their left context, short
// last chunks) decoded together: each gets the samples it gets alone, and windows of far-apart
// lengths go to separate forwards (shortest first) rather than one padded to the longest.
TEST(Qwen3OmniBatch, BatchedCode2WavWindowsGiveEachRequestItsAloneSamples) {
  SpeechRunnerOptions options;
  options.model_dir = kDir;
  auto runner = Code2WavRunner::load(options, offload::make_cpu_sim_engine({}));
  auto& model = runner->model();
  at::NoGradGuard no_grad;
  std::vector<int64_t> lengths = {4, 50, 3, 30, 6, 24, 40, 5};
  std::vector<at::Tensor> windows, alone;
  for (size_t i = 0; i < lengths.size(); ++i) {
    at::manual_seed(static_cast<uint64_t>(i));
    windows.push_back(at::randint(model.config().codebook_size,
                                  {model.config().num_quantizers, lengths[i]}, at::kLong));
    alone.push_back(model.forward_validated(windows.back()));
  }
  std::vector<size_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  // Sorted 3 4 | 5 6 | 24 30 | 40 50: no window joins one more than 1.5x its shortest.
  std::vector<std::vector<int64_t>> forwards;
  double worst = 0;
  for (size_t done = 0; done < order.size();) {
    std::vector<int64_t> rest;
    for (size_t i = done; i < order.size(); ++i) rest.push_back(lengths[order[i]]);
    const size_t n = qwen3_omni::windows_in_forward(rest, 8);
    std::vector<at::Tensor> group;
    forwards.emplace_back();
    for (size_t i = done; i < done + n; ++i) {
      group.push_back(windows[order[i]]);
      forwards.back().push_back(lengths[order[i]]);
    }
    const auto together = qwen3_omni::decode_windows(model, group);
    for (size_t i = 0; i < n; ++i) {
      const auto& expected = alone[order[done + i]];
      ASSERT_EQ(together[i].sizes(), expected.sizes()) << "window of " << group[i].size(1);
      worst = std::max(worst, (together[i] - expected).abs().max().item<double>());
    }
    done += n;
  }
  RecordProperty("code2wav_max_abs_sample_diff", std::to_string(worst));
  std::cout << "batched code2wav vs alone: max abs sample diff " << worst << "\n";
  EXPECT_LE(worst, 1e-4);
  const std::vector<std::vector<int64_t>> expected = {{3, 4}, {5, 6}, {24, 30}, {40, 50}};
  EXPECT_EQ(forwards, expected);
  // The cap: one window a forward (the CPU's setting) takes the shortest alone.
  EXPECT_EQ(qwen3_omni::windows_in_forward({3, 4, 5}, 1), 1u);
  EXPECT_EQ(qwen3_omni::windows_in_forward({4, 4, 4, 4}, 3), 3u);
  EXPECT_EQ(qwen3_omni::windows_in_forward({}, 8), 0u);
}

}  // namespace
}  // namespace omni::models
