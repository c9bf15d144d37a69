// code2wav's few-channel causal conv and trimmed transposed conv against ATen's conv1d over the
// padded input and conv_transpose1d: within the float32 rounding of either summation order, the
// same bits for a sample alone or in a batch, and only where they apply.
#include "few_channel_conv.h"  // model_runner/src/qwen3_omni: internal, tested directly

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>

namespace {

using omni::models::qwen3_omni::few_channel_causal_conv;
using omni::models::qwen3_omni::few_channel_conv_applies;
using omni::models::qwen3_omni::few_channel_transposed_conv_applies;
using omni::models::qwen3_omni::few_channel_trimmed_transposed_conv;
using omni::models::qwen3_omni::kFewChannelConvMaxInputs;

at::Tensor aten_causal_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            int64_t dilation) {
  const int64_t padding = (w.size(2) - 1) * dilation;
  const int64_t one = 1, none = 0;
  return at::conv1d(at::constant_pad_nd(x, {padding, 0}, 0), w, b, at::IntArrayRef(one),
                    at::IntArrayRef(none), at::IntArrayRef(dilation));
}

// Random inputs: x [batch, cin, length], the weight of the shape given, a bias of `bias_size`
// (none if 0), from one seeded generator.
struct Inputs {
  at::Tensor x, w, b;
};
Inputs random_inputs(uint64_t seed, int64_t batch, int64_t cin, int64_t length,
                     at::IntArrayRef weight_shape, int64_t bias_size) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Inputs in;
  in.x = at::randn({batch, cin, length}, gen, at::kFloat);
  in.w = at::randn(weight_shape, gen, at::kFloat);
  if (bias_size > 0) in.b = at::randn({bias_size}, gen, at::kFloat);
  return in;
}

// How far |out - expected| goes beyond the rounding bound of two summation orders of `terms`
// products each: any order is within terms * 2^-24 of the magnitudes' sum (`magnitude`).
double excess_over_rounding(const at::Tensor& out, const at::Tensor& expected,
                            const at::Tensor& magnitude, int64_t terms) {
  const double bound = 2 * static_cast<double>(terms) * std::ldexp(1.0, -24);
  return ((out - expected).abs() - magnitude * bound).max().item<double>();
}

struct Case {
  int64_t batch, cin, cout, taps, dilation, length;
  bool bias;
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << "batch " << c.batch << ", " << c.cin << " -> " << c.cout << " channels, kernel " << c.taps
       << " dilated " << c.dilation << ", length " << c.length << (c.bias ? "" : ", no bias");
}

class FewChannelConv : public ::testing::TestWithParam<Case> {};

TEST_P(FewChannelConv, MatchesAtenWithinFloatRounding) {
  const Case c = GetParam();
  const auto [x, w, b] = random_inputs(c.cin * 1000 + c.length, c.batch, c.cin, c.length,
                                       {c.cout, c.cin, c.taps}, c.bias ? c.cout : 0);
  ASSERT_TRUE(few_channel_conv_applies(x, w, b, 1, 1));
  const auto out = few_channel_causal_conv(x, w, b, c.dilation);
  const auto expected = aten_causal_conv(x, w, b, c.dilation);
  ASSERT_EQ(out.sizes(), expected.sizes());
  ASSERT_TRUE(out.is_contiguous());
  const auto magnitude = aten_causal_conv(x.abs(), w.abs(), c.bias ? b.abs() : b, c.dilation);
  EXPECT_LE(excess_over_rounding(out, expected, magnitude, c.cin * c.taps + 1), 0.0);
}

TEST_P(FewChannelConv, ASampleAloneGivesTheSameBitsAsInABatch) {
  const Case c = GetParam();
  const auto [x, w, b] =
      random_inputs(7, c.batch + 2, c.cin, c.length, {c.cout, c.cin, c.taps}, c.bias ? c.cout : 0);
  const auto batch = few_channel_causal_conv(x, w, b, c.dilation);
  for (int64_t i = 0; i < x.size(0); ++i) {
    EXPECT_TRUE(at::equal(few_channel_causal_conv(x.narrow(0, i, 1), w, b, c.dilation),
                          batch.narrow(0, i, 1)))
        << "sample " << i;
  }
}

// code2wav's shapes (4 to 32 channels, kernel 7 dilated 1/3/9 and kernel 1, the last conv to
// one channel), lengths around the vector widths, shorter than the padding, and no bias.
INSTANTIATE_TEST_SUITE_P(
    Shapes, FewChannelConv,
    ::testing::Values(Case{1, 4, 4, 7, 1, 4800, true}, Case{2, 4, 4, 7, 9, 1000, true},
                      Case{1, 4, 4, 1, 1, 333, true}, Case{1, 4, 1, 7, 1, 517, true},
                      Case{2, 8, 8, 7, 3, 65, true}, Case{1, 16, 16, 7, 3, 16, true},
                      Case{1, 32, 32, 7, 9, 17, true}, Case{2, 32, 6, 7, 1, 200, false},
                      Case{1, 3, 5, 3, 2, 1, true}, Case{1, 8, 3, 7, 9, 40, true},
                      Case{3, 1, 1, 2, 1, 8, false}));

// code2wav's CausalTransConvNet: ConvTranspose1d, then K - stride samples off both ends.
at::Tensor aten_trimmed_transposed_conv(const at::Tensor& x, const at::Tensor& w,
                                        const at::Tensor& b, int64_t stride) {
  const auto y = at::conv_transpose1d(x, w, b, at::IntArrayRef(stride));
  const int64_t trim = w.size(2) - stride;
  return y.narrow(2, trim, std::max<int64_t>(0, y.size(2) - 2 * trim));
}

struct TransposedCase {
  int64_t batch, cin, cout, taps, stride, length;
  bool bias;
};

void PrintTo(const TransposedCase& c, std::ostream* out) {
  *out << "batch " << c.batch << ", " << c.cin << " -> " << c.cout << " channels, kernel " << c.taps
       << " stride " << c.stride << ", length " << c.length << (c.bias ? "" : ", no bias");
}

class FewChannelTransposedConv : public ::testing::TestWithParam<TransposedCase> {};

TEST_P(FewChannelTransposedConv, MatchesAtenWithinFloatRoundingAndAloneAsInABatch) {
  const TransposedCase c = GetParam();
  const auto [x, w, b] = random_inputs(c.cin * 1000 + c.length, c.batch, c.cin, c.length,
                                       {c.cin, c.cout, c.taps}, c.bias ? c.cout : 0);
  ASSERT_TRUE(few_channel_transposed_conv_applies(x, w, b, c.stride));
  const auto out = few_channel_trimmed_transposed_conv(x, w, b, c.stride);
  const auto expected = aten_trimmed_transposed_conv(x, w, b, c.stride);
  ASSERT_EQ(out.sizes(), expected.sizes());
  ASSERT_TRUE(out.is_contiguous());
  if (out.numel() == 0) return;  // nothing left after the trim, as in ATen
  const auto magnitude =
      aten_trimmed_transposed_conv(x.abs(), w.abs(), c.bias ? b.abs() : b, c.stride);
  // Each output sums one phase's taps.
  EXPECT_LE(excess_over_rounding(out, expected, magnitude, c.cin * (c.taps / c.stride) + 1), 0.0);
  for (int64_t i = 0; i < c.batch; ++i) {
    EXPECT_TRUE(at::equal(few_channel_trimmed_transposed_conv(x.narrow(0, i, 1), w, b, c.stride),
                          out.narrow(0, i, 1)))
        << "sample " << i;
  }
}

// code2wav's upsampling (kernel = stride) and decoder blocks (kernel = 2 * stride), a kernel of
// three strides, and inputs too short to leave any output after the trim.
INSTANTIATE_TEST_SUITE_P(Shapes, FewChannelTransposedConv,
                         ::testing::Values(TransposedCase{1, 32, 32, 2, 2, 54, true},
                                           TransposedCase{2, 8, 4, 6, 3, 1517, true},
                                           TransposedCase{1, 16, 8, 8, 4, 379, true},
                                           TransposedCase{1, 32, 16, 10, 5, 76, true},
                                           TransposedCase{2, 4, 3, 9, 3, 33, false},
                                           TransposedCase{1, 4, 4, 6, 3, 1, true},
                                           TransposedCase{1, 4, 4, 9, 3, 2, true},
                                           TransposedCase{1, 4, 4, 9, 3, 3, true}));

TEST(FewChannelConvApplies, OnlyToStrideOneUngroupedCpuFloatWithFewInputs) {
  const auto x = at::zeros({1, 4, 32});
  const auto w = at::zeros({4, 4, 7});
  const auto b = at::zeros({4});
  EXPECT_TRUE(few_channel_conv_applies(x, w, b, 1, 1));
  EXPECT_TRUE(few_channel_conv_applies(x, w, at::Tensor(), 1, 1));
  EXPECT_FALSE(few_channel_conv_applies(x, w, b, 2, 1));                     // strided
  EXPECT_FALSE(few_channel_conv_applies(x, at::zeros({4, 2, 7}), b, 1, 2));  // grouped
  EXPECT_FALSE(
      few_channel_conv_applies(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), 1, 1));
  EXPECT_FALSE(few_channel_conv_applies(x.to(at::kBFloat16), w.to(at::kBFloat16),
                                        b.to(at::kBFloat16), 1, 1));
  EXPECT_FALSE(few_channel_conv_applies(x, w, at::zeros({5}), 1, 1));  // bias of another size
  const int64_t many = kFewChannelConvMaxInputs + 1;
  EXPECT_FALSE(
      few_channel_conv_applies(at::zeros({1, many, 32}), at::zeros({4, many, 7}), b, 1, 1));
  EXPECT_TRUE(
      few_channel_conv_applies(at::zeros({1, many - 1, 32}), at::zeros({4, many - 1, 7}), b, 1, 1));
}

TEST(FewChannelConvApplies, TransposedOnlyWhereTheKernelIsWholeStrides) {
  const auto x = at::zeros({1, 8, 32});
  const auto b = at::zeros({4});
  EXPECT_TRUE(few_channel_transposed_conv_applies(x, at::zeros({8, 4, 6}), b, 3));
  EXPECT_TRUE(few_channel_transposed_conv_applies(x, at::zeros({8, 4, 3}), b, 3));
  EXPECT_FALSE(few_channel_transposed_conv_applies(x, at::zeros({8, 4, 7}), b, 3));
  EXPECT_FALSE(few_channel_transposed_conv_applies(x, at::zeros({8, 4, 2}), b, 3));
  EXPECT_FALSE(few_channel_transposed_conv_applies(x, at::zeros({4, 8, 6}), at::zeros({8}), 3));
  const int64_t many = kFewChannelConvMaxInputs + 1;
  EXPECT_FALSE(
      few_channel_transposed_conv_applies(at::zeros({1, many, 8}), at::zeros({many, 4, 6}), b, 3));
  EXPECT_FALSE(few_channel_transposed_conv_applies(
      x.to(at::kBFloat16), at::zeros({8, 4, 6}, at::kBFloat16), b.to(at::kBFloat16), 3));
}

TEST(FewChannelConvApplies, ElsewhereTheCallIsRefusedWithTheShapes) {
  try {
    few_channel_causal_conv(at::zeros({1, 4, 8}), at::zeros({4, 4, 3}), at::Tensor(), 0);
    FAIL() << "dilation 0 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("dilation 0"), std::string::npos) << e.what();
  }
}

}  // namespace
