// Sampler and generate_tokens: greedy and temperature 0, the HF warpers (temperature, top-k with
// ties, top-p) against a by-hand reference, seed reproducibility, empirical distributions, and
// the generation loop's stop / length / cancel rules and parameter errors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/generation/generate.h"
#include "model_runner/generation/sampler.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

at::Tensor logits_of(const std::vector<float>& v) { return at::tensor(v, at::kFloat); }

using testing::error_of;

std::vector<double> softmax(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += p[i] = std::isinf(x[i]) ? 0.0 : std::exp(x[i] - m);
  for (double& q : p) q /= sum;
  return p;
}

// The tokens HF's warpers leave samplable, computed on plain doubles, independent of ATen.
std::set<int64_t> reference_allowed(std::vector<double> x, double temperature, int64_t top_k,
                                    double top_p) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double& v : x) v /= temperature;
  if (top_k > 0) {
    std::vector<double> sorted = x;
    std::sort(sorted.rbegin(), sorted.rend());
    const double kth = sorted[std::min<size_t>(top_k, sorted.size()) - 1];
    for (double& v : x) v = v < kth ? -inf : v;
  }
  if (top_p < 1.0) {
    const std::vector<double> p = softmax(x);
    std::vector<size_t> order(x.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
    double cumulative = 0;
    std::vector<bool> remove(x.size(), false);
    for (size_t r = 0; r < order.size(); ++r) {
      cumulative += p[order[r]];
      remove[order[r]] = r + 1 < order.size() && cumulative <= 1.0 - top_p;
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] = remove[i] ? -inf : x[i];
  }
  std::set<int64_t> allowed;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isinf(x[i])) allowed.insert(static_cast<int64_t>(i));
  }
  return allowed;
}

std::vector<int64_t> draws(const SamplingParams& params, const at::Tensor& logits, int n) {
  Sampler sampler(params);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.sample(logits));
  return out;
}

std::set<int64_t> seen(const SamplingParams& params, const at::Tensor& logits, int n) {
  const std::vector<int64_t> d = draws(params, logits, n);
  return {d.begin(), d.end()};
}

SamplingParams sampling(double temperature = 1.0, int64_t top_k = 0, double top_p = 1.0,
                        uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

TEST(SamplerTest, GreedyIsArgmaxWithFirstIndexOnTies) {
  SamplingParams p;
  p.greedy = true;
  Sampler sampler(p);
  EXPECT_EQ(sampler.sample(logits_of({1, 5, 3, 5})), 1);
  EXPECT_EQ(sampler.sample(logits_of({-2, -1, -3})), 1);
  EXPECT_EQ(sampler.sample(logits_of({7, 7, 7})), 0);
  EXPECT_EQ(sampler.sample(logits_of({0, 0, 9}).reshape({1, 3})), 2);  // [1, vocab]
}

TEST(SamplerTest, TemperatureZeroIsGreedy) {
  const at::Tensor x = logits_of({0.5, 2, 1.99, 2, -4});
  for (int64_t token : draws(sampling(/*temperature=*/0.0), x, 50)) EXPECT_EQ(token, 1);
}

TEST(SamplerTest, TopKOneAlwaysGivesTheArgmax) {
  const at::Tensor x = logits_of({0.1, 2.0, 1.9, -1, 1.95});
  EXPECT_EQ(seen(sampling(/*temperature=*/5.0, /*top_k=*/1), x, 500), std::set<int64_t>{1});
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheTopToken) {
  const at::Tensor x = logits_of({0.1, 2.0, 1.9, -1, 1.95});
  EXPECT_EQ(seen(sampling(/*temperature=*/3.0, 0, /*top_p=*/1e-6), x, 500), std::set<int64_t>{1});
}

TEST(SamplerTest, TopKKeepsTiesAtTheKthValue) {
  const std::vector<float> v = {3, 1, 2, 2, 0};
  const std::set<int64_t> expected = {0, 2, 3};  // k = 2, but token 3 ties with the 2nd largest
  EXPECT_EQ(reference_allowed({v.begin(), v.end()}, 1.0, 2, 1.0), expected);
  EXPECT_EQ(seen(sampling(1.0, /*top_k=*/2), logits_of(v), 2000), expected);
}

TEST(SamplerTest, TopKLargerThanVocabKeepsEverything) {
  EXPECT_EQ(seen(sampling(1.0, /*top_k=*/100), logits_of({0, 0.5, 1}), 2000),
            (std::set<int64_t>{0, 1, 2}));
}

TEST(SamplerTest, TopPMatchesTheReference) {
  // probs ~ .563 .207 .126 .076 .028: cumulative from below .028 .104 .230, so top_p 0.8 drops
  // tokens 4 and 3 (cumulative <= 0.2).
  const std::vector<float> v = {2.0, 1.0, 0.5, 0.0, -1.0};
  const std::set<int64_t> expected = {0, 1, 2};
  EXPECT_EQ(reference_allowed({v.begin(), v.end()}, 1.0, 0, 0.8), expected);
  EXPECT_EQ(seen(sampling(1.0, 0, /*top_p=*/0.8), logits_of(v), 2000), expected);
}

TEST(SamplerTest, WarpersComposeInHfOrder) {
  // Shuffled vocabulary so that the kept set is not a prefix.
  const std::vector<float> v = {0.3, 2.4, -1.0, 1.7, 2.0, 0.9, -0.2, 1.2};
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  for (const Case& c : {Case{1.0, 4, 0.9}, Case{0.7, 0, 0.75}, Case{2.0, 5, 0.6}, Case{1.5, 3, 1.0},
                        Case{0.5, 6, 0.95}}) {
    const std::set<int64_t> expected =
        reference_allowed({v.begin(), v.end()}, c.temperature, c.top_k, c.top_p);
    EXPECT_EQ(seen(sampling(c.temperature, c.top_k, c.top_p), logits_of(v), 2000), expected)
        << "temperature " << c.temperature << " top_k " << c.top_k << " top_p " << c.top_p;
  }
}

// HF RepetitionPenaltyLogitsProcessor: a seen token's logit is divided by the penalty when
// positive and multiplied when negative, once however often it was seen; greedy decoding
// takes the argmax after it.
TEST(SamplerTest, RepetitionPenaltyAppliesBeforeGreedyArgmax) {
  SamplingParams p;
  p.greedy = true;
  p.repetition_penalty = 2.0;
  Sampler sampler(p);
  // 0: 3.0 (seen -> 1.5), 1: 2.0 (unseen), 2: -1.0 (seen -> -2.0), 3: 1.9
  const auto logits = logits_of({3.0f, 2.0f, -1.0f, 1.9f});
  EXPECT_EQ(sampler.sample(logits), 0);             // no context: plain argmax
  EXPECT_EQ(sampler.sample(logits, {0, 0, 2}), 1);  // 3.0 / 2 < 2.0
  // The caller's logits are left alone.
  EXPECT_TRUE(at::equal(logits, logits_of({3.0f, 2.0f, -1.0f, 1.9f})));
  // A penalty of 1 changes nothing; ids outside the vocabulary are ignored.
  p.repetition_penalty = 1.0;
  EXPECT_EQ(Sampler(p).sample(logits, {0, 7, -3}), 0);
  // A negative logit gets more negative: token 2 (-1 -> -2) loses against token 3 (-1.5).
  p.repetition_penalty = 2.0;
  EXPECT_EQ(Sampler(p).sample(logits_of({-1.0f, -5.0f, -1.0f, -1.5f}), {0, 2}), 3);
}

TEST(SamplerTest, SuppressedTokensAreNeverDrawn) {
  SamplingParams p;
  p.greedy = true;
  p.suppress_tokens = {0, 3, 99};
  EXPECT_EQ(Sampler(p).sample(logits_of({5.0f, 1.0f, 2.0f, 4.0f})), 2);
  p.greedy = false;
  p.temperature = 1.0;
  Sampler sampler(p);
  for (int i = 0; i < 200; ++i) {
    const int64_t t = sampler.sample(logits_of({5.0f, 1.0f, 2.0f, 4.0f}));
    ASSERT_TRUE(t == 1 || t == 2) << t;
  }
  p.suppress_tokens = {0, 1, 2, 3};
  EXPECT_THROW(Sampler(p).sample(logits_of({5.0f, 1.0f, 2.0f, 4.0f})), Error);
}

TEST(GenerateTokensTest, RepetitionPenaltySeesThePromptAndTheAnswer) {
  SamplingParams p;
  p.greedy = true;
  p.repetition_penalty = 10.0;
  p.max_new_tokens = 3;
  // Every step the same logits: token 0 is best, then 1, then 2, then 3.
  const auto next = [](int64_t, const std::vector<int64_t>&) {
    return logits_of({4.0f, 3.0f, 2.0f, 1.0f});
  };
  // The prompt holds 0: the penalty rules it out, then each answer token rules itself out.
  EXPECT_EQ(generate_tokens(next, p, nullptr, {0}).tokens, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(generate_tokens(next, p).tokens, (std::vector<int64_t>{0, 1, 2}));
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  const at::Tensor x = at::zeros({16});
  const std::vector<int64_t> a = draws(sampling(1.0, 0, 1.0, /*seed=*/7), x, 64);
  EXPECT_EQ(a, draws(sampling(1.0, 0, 1.0, /*seed=*/7), x, 64));
  EXPECT_NE(a, draws(sampling(1.0, 0, 1.0, /*seed=*/8), x, 64));
  // The generator advances per call: one sampler does not repeat one token forever.
  EXPECT_GT(std::set<int64_t>(a.begin(), a.end()).size(), 4u);
}

// The batch's draws are each row's own: sample_rows over [B, vocab] gives, bit for bit, what
// each row's sampler gives alone, with shared parameters (warpers run once over the batch) and
// with mixed ones (greedy and sampled rows side by side), each row with its own repetition
// context or none.
TEST(SamplerTest, SampleRowsGivesEachRowItsOwnDraws) {
  at::manual_seed(3);
  for (bool mixed : {false, true}) {
    for (bool penalty : {false, true}) {
      SCOPED_TRACE(std::string(mixed ? "mixed" : "shared") + " parameters, " +
                   (penalty ? "with" : "without") + " repetition contexts");
      std::vector<Sampler> alone, batched;
      for (uint64_t i = 0; i < 6; ++i) {
        SamplingParams p = sampling(0.8, 20, 0.9, /*seed=*/100 + i);
        p.suppress_tokens = std::vector<int64_t>{3, 5, 999};
        if (penalty) p.repetition_penalty = 3.0;
        if (mixed && i % 3 == 0) p.greedy = true;
        if (mixed && i == 4) p.top_k = 5;
        alone.emplace_back(p);
        batched.emplace_back(p);
      }
      std::vector<Sampler*> rows;
      for (auto& s : batched) rows.push_back(&s);
      std::vector<std::vector<int64_t>> drawn(6);  // each row's ids so far: its context
      std::vector<const std::vector<int64_t>*> contexts;
      for (int64_t i = 0; i < 6; ++i) contexts.push_back(i == 2 ? nullptr : &drawn[i]);
      for (int step = 0; step < 30; ++step) {
        const at::Tensor logits = at::randn({6, 64}) * 3;
        const auto ids = penalty ? Sampler::sample_rows(rows, logits, contexts)
                                 : Sampler::sample_rows(rows, logits);
        for (int64_t i = 0; i < 6; ++i) {
          const std::vector<int64_t> none;
          const auto& context = penalty && contexts[i] ? drawn[i] : none;
          EXPECT_EQ(ids[i], alone[i].sample(logits[i], context)) << "row " << i << " step " << step;
          EXPECT_NE(ids[i], 3);
          EXPECT_NE(ids[i], 5);
        }
        for (int64_t i = 0; i < 6; ++i) drawn[i].push_back(ids[i]);
      }
    }
  }
}

// A repetition context really moves the batch's draws: a strongly penalized favourite is left
// for the others.
TEST(SamplerTest, SampleRowsAppliesEachRowsRepetitionContext) {
  SamplingParams p = sampling(1.0, 0, 1.0, /*seed=*/9);
  p.repetition_penalty = 1000.0;
  Sampler a(p), b(p);
  const at::Tensor logits = logits_of({10, 10, 12}).unsqueeze(0).expand({2, 3}).contiguous();
  const std::vector<int64_t> seen_favourite(1, 2), nothing;
  for (int step = 0; step < 20; ++step) {
    const auto ids = Sampler::sample_rows({&a, &b}, logits, {&seen_favourite, &nothing});
    EXPECT_NE(ids[0], 2) << "step " << step;
  }
  std::set<int64_t> free_row;
  for (int step = 0; step < 20; ++step) {
    free_row.insert(Sampler::sample_rows({&a, &b}, logits, {&seen_favourite, &nothing})[1]);
  }
  EXPECT_TRUE(free_row.count(2));
}

// A sampled id is the one torch.multinomial(probs, 1) draws from a generator with the same seed
// (what HF's generate does), alone and in a batch, with and without masked-out tokens.
TEST(SamplerTest, DrawsAreTorchMultinomialsWithTheSameSeed) {
  at::manual_seed(5);
  for (int64_t vocab : {7, 128, 1152}) {
    SCOPED_TRACE(vocab);
    std::vector<Sampler> alone, batched;
    std::vector<at::Generator> reference;
    for (uint64_t i = 0; i < 4; ++i) {
      alone.emplace_back(sampling(1.0, 0, 1.0, /*seed=*/40 + i));
      batched.emplace_back(sampling(1.0, 0, 1.0, /*seed=*/40 + i));
      reference.push_back(at::make_generator<at::CPUGeneratorImpl>(40 + i));
    }
    std::vector<at::Generator> reference_rows = reference;
    for (auto& g : reference_rows) g = g.clone();
    std::vector<Sampler*> rows;
    for (auto& s : batched) rows.push_back(&s);
    for (int step = 0; step < 40; ++step) {
      at::Tensor logits = at::randn({4, vocab}) * 2;
      if (step % 2) logits.narrow(1, 0, vocab / 2).fill_(-std::numeric_limits<float>::infinity());
      const at::Tensor probs = at::softmax(logits, -1);
      const auto ids = Sampler::sample_rows(rows, logits);
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t expected =
            at::multinomial(probs[i], 1, /*replacement=*/false, reference[i]).item<int64_t>();
        EXPECT_EQ(alone[i].sample(logits[i]), expected) << "row " << i << " step " << step;
        EXPECT_EQ(
            ids[i],
            at::multinomial(probs[i], 1, /*replacement=*/false, reference_rows[i]).item<int64_t>())
            << "row " << i << " step " << step;
      }
    }
  }
}

// Noise drawn ahead for a whole frame (Sampler::draw_noise, as the code predictor does) gives
// the ids drawing at each step gives: bitwise, through the shared and the per-row paths, with a
// greedy row (which draws nothing) among them, and again as multinomial's with the same seed.
TEST(SamplerTest, NoiseDrawnAheadGivesTheSameIdsAsDrawingEachTime) {
  at::manual_seed(11);
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "mixed parameters" : "shared parameters");
    constexpr int64_t kRows = 5, kDraws = 15, kVocab = 96;
    std::vector<Sampler> now, ahead;
    std::vector<at::Generator> reference;
    for (uint64_t i = 0; i < kRows; ++i) {
      SamplingParams p = sampling(0.9, 0, 1.0, /*seed=*/70 + i);
      if (mixed && i == 1) p.greedy = true;
      if (mixed && i == 3) p.top_k = 7;
      now.emplace_back(p);
      ahead.emplace_back(p);
      reference.push_back(at::make_generator<at::CPUGeneratorImpl>(70 + i));
    }
    std::vector<Sampler*> now_rows, ahead_rows;
    for (auto& s : now) now_rows.push_back(&s);
    for (auto& s : ahead) ahead_rows.push_back(&s);
    for (int frame = 0; frame < 3; ++frame) {
      const at::Tensor noise = Sampler::draw_noise(ahead_rows, kDraws, kVocab);
      ASSERT_EQ(noise.sizes(), (std::vector<int64_t>{kRows, kDraws, kVocab}));
      for (int64_t k = 0; k < kDraws; ++k) {
        const at::Tensor logits = at::randn({kRows, kVocab}) * 2;
        const auto drawn_now = Sampler::sample_rows(now_rows, logits);
        EXPECT_EQ(Sampler::sample_rows(ahead_rows, logits, {}, noise.select(1, k)), drawn_now)
            << "frame " << frame << " draw " << k;
        if (mixed) continue;  // the reference below is plain multinomial over the softmax
        for (int64_t i = 0; i < kRows; ++i) {
          const at::Tensor probs = at::softmax(logits[i] / 0.9, -1);
          EXPECT_EQ(drawn_now[i], at::multinomial(probs, 1, false, reference[i]).item<int64_t>())
              << "row " << i << " frame " << frame << " draw " << k;
        }
      }
    }
  }
}

// The noise is the generator's uniform_ numbers, and the generator goes on from where they end.
TEST(SamplerTest, NoiseIsTheGeneratorsUniformDoublesInOrder) {
  Sampler sampler(sampling(1.0, 0, 1.0, /*seed=*/5));
  std::vector<Sampler*> rows{&sampler};
  at::Generator reference = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int call = 0; call < 3; ++call) {
    const at::Tensor noise = Sampler::draw_noise(rows, 3, 50);
    const at::Tensor expected =
        at::empty({1, 3, 50}, at::TensorOptions(at::kDouble)).uniform_(0.0, 1.0, reference);
    EXPECT_TRUE(at::equal(noise, expected)) << "call " << call;
  }
}

TEST(SamplerTest, NoiseForAnotherVocabularyIsAnError) {
  Sampler s(sampling(1.0, 0, 1.0, /*seed=*/1));
  const at::Tensor noise = Sampler::draw_noise({&s}, 2, 10);
  const std::string error = error_of([&] {
    Sampler::sample_rows({&s}, at::randn({1, 12}), {}, noise.select(1, 0));
  });
  EXPECT_NE(error.find("noise drawn ahead for"), std::string::npos) << error;
  EXPECT_NE(error_of([&] { Sampler::draw_noise({&s}, 0, 10); }).find("draws > 0"),
            std::string::npos);
}

// HF's top-p written with ATen ops, as transformers writes it.
at::Tensor hf_top_p(const at::Tensor& logits, double top_p) {
  auto [sorted, indices] = at::sort(logits, /*stable=*/true, /*dim=*/-1, /*descending=*/false);
  at::Tensor remove_sorted = at::softmax(sorted, -1).cumsum(-1) <= (1.0 - top_p);
  remove_sorted.narrow(-1, remove_sorted.size(-1) - 1, 1).fill_(false);
  const at::Tensor remove = at::zeros_like(remove_sorted).scatter(-1, indices, remove_sorted);
  return logits.masked_fill(remove, -std::numeric_limits<float>::infinity());
}

// Three samplers with `params` and seeds seed, seed + 1, seed + 2, drawing alone and as one batch
// over `steps` random logits (vocabularies vocabs[step % 2], ties every third step, the first
// third of the ids at -inf every fourth): each id is multinomial's over softmax(hf_warp(logits))
// with the same seed.
void expect_hf_draws(SamplingParams params, uint64_t seed, int steps,
                     const std::array<int64_t, 2>& vocabs,
                     const std::function<at::Tensor(const at::Tensor&)>& hf_warp) {
  std::vector<Sampler> alone, batched;
  std::vector<at::Generator> reference, reference_rows;
  for (uint64_t i = 0; i < 3; ++i) {
    params.seed = seed + i;
    alone.emplace_back(params);
    batched.emplace_back(params);
    reference.push_back(at::make_generator<at::CPUGeneratorImpl>(seed + i));
    reference_rows.push_back(at::make_generator<at::CPUGeneratorImpl>(seed + i));
  }
  std::vector<Sampler*> rows;
  for (auto& x : batched) rows.push_back(&x);
  for (int step = 0; step < steps; ++step) {
    const int64_t vocab = vocabs[step % 2];
    at::Tensor logits = at::randn({3, vocab}) * 3;
    if (step % 3 == 0) logits = logits.round();  // ties, at the k-th value too
    if (step % 4 == 0)
      logits.narrow(1, 0, vocab / 3).fill_(-std::numeric_limits<float>::infinity());
    const at::Tensor probs = at::softmax(hf_warp(logits), -1);
    const auto ids = Sampler::sample_rows(rows, logits);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(alone[i].sample(logits[i]),
                at::multinomial(probs[i], 1, false, reference[i]).item<int64_t>())
          << "row " << i << " step " << step;
      EXPECT_EQ(ids[i], at::multinomial(probs[i], 1, false, reference_rows[i]).item<int64_t>())
          << "row " << i << " step " << step;
    }
  }
}

// The sampler's top-p keeps exactly HF's tokens, ties and -inf logits included: its draws are
// multinomial's over HF's warped distribution, with the same seed, alone and in a batch.
TEST(SamplerTest, TopPKeepsHfsTokensOnTiesAndMaskedLogits) {
  at::manual_seed(21);
  for (double top_p : {0.3, 0.8, 0.95}) {
    SCOPED_TRACE(top_p);
    expect_hf_draws(sampling(1.0, 0, top_p), /*seed=*/70, 60, {37, 128},
                    [&](const at::Tensor& logits) { return hf_top_p(logits, top_p); });
  }
}

// HF's top-k written with ATen ops, as transformers writes it.
at::Tensor hf_top_k(const at::Tensor& logits, int64_t top_k) {
  const int64_t k = std::min(top_k, logits.size(-1));
  const at::Tensor kth = std::get<0>(at::topk(logits, k)).narrow(-1, k - 1, 1);
  return logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
}

// The code predictor's warpers (top-k, then top-p) keep exactly HF's tokens over ties, -inf
// logits and a cut that keeps the whole vocabulary: the draws are multinomial's over HF's
// warped distribution with the same seed, alone and in a batch.
TEST(SamplerTest, TopKThenTopPKeepsHfsTokens) {
  at::manual_seed(33);
  for (int64_t top_k : {1, 3, 50, 2000}) {
    SCOPED_TRACE(top_k);
    expect_hf_draws(
        sampling(0.9, top_k, 0.8), /*seed=*/90, 40, {1152, 128},
        [&](const at::Tensor& logits) { return hf_top_p(hf_top_k(logits / 0.9, top_k), 0.8); });
  }
}

// Exact quarters: the cumulative probability meets 1 - top_p exactly at the second token of the
// stable ascending order, and HF removes it (<=), keeping the last two.
TEST(SamplerTest, TopPRemovesATokenWhoseCumulativeProbabilityEqualsTheCut) {
  EXPECT_EQ(seen(sampling(1.0, 0, /*top_p=*/0.5), logits_of({0, 0, 0, 0}), 400),
            (std::set<int64_t>{2, 3}));
  // -0 equals +0 for the stable sort: the order is still the ids', whatever the signs.
  EXPECT_EQ(seen(sampling(1.0, 0, /*top_p=*/0.5), logits_of({0.0f, -0.0f, 0.0f, -0.0f}), 400),
            (std::set<int64_t>{2, 3}));
}

void expect_distribution(double temperature, const std::vector<double>& expected) {
  const int n = 20000;
  std::map<int64_t, int> counts;
  for (int64_t t : draws(sampling(temperature), logits_of({0, 1, 2}), n)) ++counts[t];
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(counts[static_cast<int64_t>(i)] / static_cast<double>(n), expected[i], 0.02)
        << "token " << i << " at temperature " << temperature;
  }
}

TEST(SamplerTest, EmpiricalDistributionMatchesSoftmax) {
  expect_distribution(1.0, softmax({0, 1, 2}));  // ~ .090 .245 .665
}

TEST(SamplerTest, LowTemperatureSharpens) {
  const std::vector<double> sharp = softmax({0, 2, 4});  // softmax(x / 0.5) ~ .016 .117 .867
  expect_distribution(0.5, sharp);
  EXPECT_GT(sharp[2], softmax({0, 1, 2})[2]);
}

TEST(SamplerTest, Bfloat16LogitsSampleLikeFloat32) {
  // Values exact in bf16: the float32 copy is identical, so the draws are too.
  const at::Tensor f = logits_of({0.5, 1.0, 2.0, -1.0, 0.25});
  const at::Tensor b = f.to(at::kBFloat16);
  EXPECT_EQ(draws(sampling(0.8, 4, 0.9), b, 200), draws(sampling(0.8, 4, 0.9), f, 200));
  SamplingParams g;
  g.greedy = true;
  EXPECT_EQ(Sampler(g).sample(b), 2);
  EXPECT_EQ(Sampler(g).sample(f.to(at::kHalf)), 2);
  EXPECT_EQ(Sampler(g).sample(f.to(at::kDouble)), 2);
}

TEST(SamplerTest, CudaLogitsSampleLikeCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor f = logits_of({0.5, 1.0, 2.0, -1.0, 0.25});
  EXPECT_EQ(draws(sampling(0.8, 4, 0.9), f.to(at::kCUDA), 200),
            draws(sampling(0.8, 4, 0.9), f, 200));
}

TEST(SamplerTest, BadLogitsAreErrors) {
  Sampler sampler(sampling());
  EXPECT_NE(error_of([&] {
              sampler.sample(at::zeros({2, 3}));
            }).find("[vocab]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sampler.sample(at::zeros({3}, at::kLong)); }).find("floating"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sampler.sample(logits_of({0, NAN})); }).find("NaN"), std::string::npos);
  EXPECT_NE(error_of([&] { sampler.sample(at::empty({0})); }).find("empty"), std::string::npos);
}

void expect_param_error(const SamplingParams& p, const std::string& field,
                        const std::string& value) {
  const std::string message = error_of([&] { p.validate(); });
  EXPECT_NE(message.find(field), std::string::npos) << message;
  EXPECT_NE(message.find(value), std::string::npos) << message;
  // The constructor and the loop validate too.
  EXPECT_NE(error_of([&] { Sampler s(p); }).find(field), std::string::npos);
  EXPECT_NE(error_of([&] {
              generate_tokens([](int64_t, auto&) { return at::zeros({2}); }, p);
            }).find(field),
            std::string::npos);
}

TEST(SamplingParamsTest, RepetitionPenaltyMustBePositive) {
  SamplingParams p;
  p.repetition_penalty = 0.0;
  EXPECT_NE(error_of([&] { p.validate(); }).find("repetition_penalty"), std::string::npos);
  p.repetition_penalty = std::numeric_limits<double>::infinity();
  EXPECT_THROW(p.validate(), Error);
}

TEST(SamplingParamsTest, InvalidParamsNameTheField) {
  SamplingParams p;
  p.temperature = -0.5;
  expect_param_error(p, "temperature", "-0.5");
  p.temperature = INFINITY;
  expect_param_error(p, "temperature", "inf");
  p.temperature = NAN;
  expect_param_error(p, "temperature", "nan");
  p = SamplingParams();
  p.top_p = 0.0;
  expect_param_error(p, "top_p", "0");
  p.top_p = 1.5;
  expect_param_error(p, "top_p", "1.5");
  p = SamplingParams();
  p.top_k = -3;
  expect_param_error(p, "top_k", "-3");
  p = SamplingParams();
  p.max_new_tokens = -1;
  expect_param_error(p, "max_new_tokens", "-1");
  EXPECT_NO_THROW(SamplingParams().validate());
}

// Greedy logits that pick script[step] (and 0 after the script ends); records the calls.
struct ScriptedModel {
  std::vector<int64_t> script;
  std::vector<std::vector<int64_t>> seen_generated;
  at::Tensor operator()(int64_t step, const std::vector<int64_t>& generated) {
    EXPECT_EQ(step, static_cast<int64_t>(generated.size()));
    seen_generated.push_back(generated);
    at::Tensor x = at::zeros({10});
    x[step < static_cast<int64_t>(script.size()) ? script[step] : 0] = 5.0;
    return x;
  }
};

SamplingParams greedy_params(int64_t max_new_tokens, std::vector<int64_t> stops = {}) {
  SamplingParams p;
  p.greedy = true;
  p.max_new_tokens = max_new_tokens;
  p.stop_token_ids = std::move(stops);
  return p;
}

TEST(GenerateTest, StopsAfterAStopTokenIncludingIt) {
  ScriptedModel model{{3, 4, 9, 5, 6}, {}};
  const GenerationResult r = generate_tokens(std::ref(model), greedy_params(10, {8, 9}));
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{3, 4, 9}));
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(model.seen_generated,
            (std::vector<std::vector<int64_t>>{{}, {3}, {3, 4}}));  // the prefix at each step
}

TEST(GenerateTest, StopsAtMaxNewTokens) {
  ScriptedModel model{{1, 2, 3, 4, 5}, {}};
  const GenerationResult r = generate_tokens(std::ref(model), greedy_params(3, {9}));
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r.finish_reason, "length");
  const GenerationResult none = generate_tokens(std::ref(model), greedy_params(0));
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.finish_reason, "length");
}

TEST(GenerateTest, StreamsTokensInOrder) {
  ScriptedModel model{{7, 1, 7, 2}, {}};
  std::vector<int64_t> streamed;
  const GenerationResult r = generate_tokens(std::ref(model), greedy_params(4), [&](int64_t t) {
    // Each token arrives before the next step's logits are asked for.
    EXPECT_EQ(model.seen_generated.size(), streamed.size() + 1);
    streamed.push_back(t);
    return true;
  });
  EXPECT_EQ(streamed, (std::vector<int64_t>{7, 1, 7, 2}));
  EXPECT_EQ(streamed, r.tokens);
}

TEST(GenerateTest, OnTokenFalseCancels) {
  ScriptedModel model{{1, 2, 3, 4}, {}};
  int calls = 0;
  const GenerationResult r =
      generate_tokens(std::ref(model), greedy_params(10), [&](int64_t) { return ++calls < 2; });
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_EQ(model.seen_generated.size(), 2u);  // no step after the cancel
}

TEST(GenerateTest, SampledRunIsReproducibleFromTheSeed) {
  auto run = [](uint64_t seed) {
    SamplingParams p = sampling(1.0, 0, 1.0, seed);
    p.max_new_tokens = 32;
    return generate_tokens([](int64_t, const std::vector<int64_t>&) { return at::zeros({50}); }, p)
        .tokens;
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
}

// The prompt plus max_new_tokens must fit the model's context; a huge cap (a request's
// max_tokens) is refused before any logits are asked for, and never sized up front.
TEST(GenerateTokensTest, ContextBoundsThePromptPlusNewTokens) {
  SamplingParams p;
  p.greedy = true;
  p.max_context = 8;
  int calls = 0;
  const auto next = [&](int64_t, const std::vector<int64_t>&) {
    ++calls;
    return logits_of({1.0f, 2.0f});
  };
  p.max_new_tokens = 5;
  EXPECT_EQ(generate_tokens(next, p, nullptr, {0, 0, 0}).tokens.size(), 5u);  // 3 + 5 = 8 fits
  calls = 0;
  p.max_new_tokens = 6;
  const std::string over = error_of([&] { generate_tokens(next, p, nullptr, {0, 0, 0}); });
  EXPECT_NE(over.find("at most 5 new tokens"), std::string::npos) << over;
  p.max_new_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_NE(error_of([&] { generate_tokens(next, p, nullptr, {0}); }).find("context of 8"),
            std::string::npos);
  p.max_new_tokens = 1;
  EXPECT_NE(error_of([&] {
              generate_tokens(next, p, nullptr, std::vector<int64_t>(8, 0));
            }).find("does not fit"),
            std::string::npos);
  EXPECT_EQ(calls, 0);
  // Without a context, a huge cap is only a cap: generation ends at the stop token.
  p.max_context = 0;
  p.max_new_tokens = std::numeric_limits<int64_t>::max();
  p.stop_token_ids = {1};
  EXPECT_EQ(generate_tokens(next, p).tokens, (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace omni::models
