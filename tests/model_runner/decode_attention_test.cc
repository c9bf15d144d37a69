// The decode step's one-pass attention against the reference's ATen ops (repeated KV heads,
// matmul, float32 scale, softmax, matmul): within float32 rounding, the same bits for a row alone
// or in a batch, over KV-cache views with spare capacity, and only where it applies.
#include "decode_attention.h"  // model_runner/src/qwen3_omni: internal, tested directly

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

namespace {

using omni::models::qwen3_omni::decode_attention;
using omni::models::qwen3_omni::decode_attention_applies;
using omni::models::qwen3_omni::kDecodeAttentionMaxWork;
using omni::models::qwen3_omni::KeysValues;

// As TextAttention::attend writes it for one row: [1, heads, 1, d] over [1, kv, len, d].
at::Tensor reference_row(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         float scale) {
  const int64_t rep = q.size(1) / k.size(1);
  const auto keys = k.repeat_interleave(rep, 1);
  const auto values = v.repeat_interleave(rep, 1);
  auto scores = at::matmul(q, keys.transpose(2, 3));
  scores.mul_(at::scalar_tensor(scale, at::kFloat));
  const auto out = at::matmul(at::softmax(scores, -1), values);  // [1, heads, 1, d]
  return out.transpose(1, 2).reshape({1, 1, q.size(1) * q.size(3)});
}

// A KvCache's view: the first `len` positions of a [n, kv, capacity, d] buffer.
KeysValues cache_view(at::Generator& gen, int64_t n, int64_t kv_heads, int64_t len, int64_t d) {
  const int64_t capacity = len + 7;
  const auto k = at::randn({n, kv_heads, capacity, d}, gen, at::kFloat);
  const auto v = at::randn({n, kv_heads, capacity, d}, gen, at::kFloat);
  return {k.narrow(2, 0, len), v.narrow(2, 0, len)};
}

struct Case {
  int64_t heads, kv_heads, d;
  std::vector<int64_t> lengths;  // one per row: a view each; one value: one view for all rows
  int64_t rows;
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.rows << " rows, " << c.heads << " heads over " << c.kv_heads << ", d " << c.d
       << (c.lengths.size() == 1 ? ", one view of length " : ", a view per row, lengths");
  for (const auto l : c.lengths) *out << " " << l;
}

struct Inputs {
  at::Tensor q;
  std::vector<KeysValues> kv;
  float scale;
};

Inputs random_inputs(const Case& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.heads * 100 + c.d + c.lengths[0]);
  Inputs in;
  // Laid out as TextAttention's q after rope: [b, 1, heads, d] memory seen as [b, heads, 1, d].
  in.q = at::randn({c.rows, 1, c.heads, c.d}, gen, at::kFloat).transpose(1, 2);
  if (c.lengths.size() == 1) {
    in.kv.push_back(cache_view(gen, c.rows, c.kv_heads, c.lengths[0], c.d));
  } else {
    for (const auto len : c.lengths) in.kv.push_back(cache_view(gen, 1, c.kv_heads, len, c.d));
  }
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  return in;
}

// Row r's keys and values alone: [1, kv, len, d].
KeysValues row_of(const std::vector<KeysValues>& kv, int64_t r) {
  if (kv.size() > 1) return kv[static_cast<size_t>(r)];
  return {kv[0].first.narrow(0, r, 1), kv[0].second.narrow(0, r, 1)};
}

class DecodeAttention : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttention, MatchesTheReferenceOpsWithinFloatRounding) {
  const Case c = GetParam();
  const auto in = random_inputs(c);
  ASSERT_TRUE(decode_attention_applies(in.q, in.kv));
  const auto out = decode_attention(in.q, in.kv, in.scale);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{c.rows, 1, c.heads * c.d}));
  ASSERT_TRUE(out.is_contiguous());
  for (int64_t r = 0; r < c.rows; ++r) {
    const auto [k, v] = row_of(in.kv, r);
    const auto expected = reference_row(in.q.narrow(0, r, 1), k, v, in.scale);
    // The output is a convex mix of values of magnitude ~1: float32 rounding of two summation
    // orders over up to a few hundred terms stays far below 1e-5.
    EXPECT_LE((out.narrow(0, r, 1) - expected).abs().max().item<double>(), 1e-5) << "row " << r;
  }
}

TEST_P(DecodeAttention, ARowAloneGivesTheSameBitsAsInTheBatch) {
  const Case c = GetParam();
  const auto in = random_inputs(c);
  const auto batch = decode_attention(in.q, in.kv, in.scale);
  for (int64_t r = 0; r < c.rows; ++r) {
    const auto alone = decode_attention(in.q.narrow(0, r, 1), {row_of(in.kv, r)}, in.scale);
    EXPECT_TRUE(at::equal(alone, batch.narrow(0, r, 1))) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeAttention,
    ::testing::Values(Case{4, 2, 16, {1}, 1},             // the tiny talker's first step
                      Case{4, 2, 16, {9, 1, 33, 60}, 4},  // talker rows of their own lengths
                      Case{4, 2, 8, {17}, 8},             // the code predictor: one length
                      Case{4, 4, 8, {5, 12}, 2},          // no grouping
                      Case{8, 1, 8, {3, 40, 2}, 3},       // every head on one KV head
                      Case{8, 2, 64, {64}, 2},            // at the work cap
                      Case{16, 2, 128, {1, 16, 9}, 3},    // the released talker's heads
                      Case{4, 2, 12, {7, 13}, 2}));       // d not a multiple of 8

TEST(DecodeAttentionApplies, OnlyOneCpuFloatQueryPerRowWithMatchingViews) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto q = at::randn({2, 4, 1, 8}, gen, at::kFloat);
  const auto one = cache_view(gen, 1, 2, 5, 8);
  const auto both = cache_view(gen, 2, 2, 5, 8);
  EXPECT_TRUE(decode_attention_applies(q, {one, one}));
  EXPECT_TRUE(decode_attention_applies(q, {both}));
  EXPECT_FALSE(decode_attention_applies(q, {}));
  EXPECT_FALSE(decode_attention_applies(q, {one}));            // one view of one row for two
  EXPECT_FALSE(decode_attention_applies(q, {one, one, one}));  // three views for two rows
  EXPECT_FALSE(decode_attention_applies(q.to(at::kBFloat16), {one, one}));
  EXPECT_FALSE(decode_attention_applies(at::randn({2, 4, 2, 8}, gen), {one, one}));   // two queries
  EXPECT_FALSE(decode_attention_applies(at::randn({2, 3, 1, 8}, gen), {one, one}));   // 3 over 2
  EXPECT_FALSE(decode_attention_applies(at::randn({2, 4, 1, 16}, gen), {one, one}));  // d differs
  const KeysValues bf16{one.first.to(at::kBFloat16), one.second.to(at::kBFloat16)};
  EXPECT_FALSE(decode_attention_applies(q, {one, bf16}));
  const KeysValues mismatched{one.first, cache_view(gen, 1, 2, 6, 8).second};
  EXPECT_FALSE(decode_attention_applies(q, {one, mismatched}));
  const KeysValues strided_d{at::randn({1, 2, 8, 5}, gen).transpose(2, 3), one.second};
  EXPECT_FALSE(decode_attention_applies(q, {one, strided_d}));
  EXPECT_THROW(decode_attention(q, {one}, 1.0f), std::exception);
}

TEST(DecodeAttentionApplies, UpToTheWorkCapPerRowOnly) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const int64_t heads = 4, d = 16, cap_len = kDecodeAttentionMaxWork / (heads * d);
  const auto q = at::randn({2, heads, 1, d}, gen, at::kFloat);
  const auto at_cap = cache_view(gen, 1, 2, cap_len, d);
  const auto beyond = cache_view(gen, 1, 2, cap_len + 1, d);
  const auto short_row = cache_view(gen, 1, 2, 3, d);
  EXPECT_TRUE(decode_attention_applies(q, {short_row, at_cap}));
  EXPECT_FALSE(decode_attention_applies(q, {short_row, beyond}));
  // A row decides by its own length: the short one still applies alone.
  EXPECT_TRUE(decode_attention_applies(q.narrow(0, 0, 1), {short_row}));
  EXPECT_FALSE(decode_attention_applies(q.narrow(0, 1, 1), {beyond}));
}

}  // namespace
