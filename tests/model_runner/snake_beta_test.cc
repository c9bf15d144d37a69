// code2wav's fused SnakeBeta pass against the reference's ATen ops: within a few float32 ulps
// of sin^2 where it applies, bit for bit the same sample alone or in a batch, and the reference's
// exact ops where it does not apply or an argument is beyond its sine's range.
#include "snake_beta.h"  // model_runner/src/qwen3_omni: internal, tested directly

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

using omni::models::qwen3_omni::fused_snake_beta_applies;
using omni::models::qwen3_omni::snake_beta;

at::Tensor reference(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta) {
  return x + inv_beta.view({1, -1, 1}) * (x * alpha.view({1, -1, 1})).sin().pow(2);
}

struct Params {
  at::Tensor alpha, inv_beta;
};

Params params(int64_t channels, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto alpha = at::exp(at::randn({channels}, gen, at::kFloat));
  const auto beta = at::exp(at::randn({channels}, gen, at::kFloat));
  return {alpha, at::reciprocal(beta + 1e-9)};
}

TEST(SnakeBeta, FusedPassIsWithinFourUlpOfTheReference) {
  const auto p = params(6, 1);
  // Every argument from -500 to 500 in steps of 1/64, and some random ones.
  auto sweep = at::arange(-32000, 32000, at::kFloat).div_(64).view({1, 1, -1}).expand({2, 6, -1});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto x =
      at::cat({sweep, at::randn({2, 6, 64000}, gen, at::kFloat).mul_(20)}, 2).contiguous();
  ASSERT_TRUE(fused_snake_beta_applies(x));
  const auto fused = snake_beta(x, p.alpha, p.inv_beta);
  const auto expected = reference(x, p.alpha, p.inv_beta);
  // sin^2 is at most 1: four of its ulps, scaled by inv_beta, then the sum's own rounding.
  const auto bound = p.inv_beta.view({1, -1, 1}) * (4 * std::ldexp(1.0, -24)) +
                     expected.abs() * std::ldexp(1.0, -23);
  const auto excess = ((fused - expected).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0);
  // It is a different computation from ATen's sine, not a call to it.
  EXPECT_FALSE(at::equal(fused, expected));
}

TEST(SnakeBeta, EachSampleIsTheSameAloneInABatchOrFromAView) {
  const auto p = params(4, 2);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto a = at::randn({1, 4, 1003}, gen, at::kFloat).mul_(5);
  const auto b = at::randn({1, 4, 1003}, gen, at::kFloat).mul_(5);
  const auto batch = snake_beta(at::cat({a, b}, 0), p.alpha, p.inv_beta);
  EXPECT_TRUE(at::equal(batch[0], snake_beta(a, p.alpha, p.inv_beta)[0]));
  EXPECT_TRUE(at::equal(batch[1], snake_beta(b, p.alpha, p.inv_beta)[0]));
  // A window of a longer row (another start, another vector tail) gives its samples unchanged.
  const auto window = a.narrow(2, 5, 990);
  ASSERT_FALSE(window.is_contiguous());
  EXPECT_TRUE(at::equal(snake_beta(window, p.alpha, p.inv_beta),
                        snake_beta(a, p.alpha, p.inv_beta).narrow(2, 5, 990)));
}

TEST(SnakeBeta, ArgumentsBeyondTheSineRangeTakeTheReferenceOps) {
  const auto p = params(3, 4);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto x = at::randn({2, 3, 300}, gen, at::kFloat);
  const auto within = snake_beta(x, p.alpha, p.inv_beta);
  EXPECT_FALSE(at::equal(within, reference(x, p.alpha, p.inv_beta)));
  x[1][2][17] = 1e6f / p.alpha[2].item<float>();
  EXPECT_TRUE(at::equal(snake_beta(x, p.alpha, p.inv_beta), reference(x, p.alpha, p.inv_beta)));
}

TEST(SnakeBeta, NanStaysNanAndInfinityTakesTheReferenceOps) {
  const auto p = params(1, 6);
  const auto x = at::tensor({0.5f, std::nanf(""), 0.0f}).view({1, 1, -1});
  const auto fused = snake_beta(x, p.alpha, p.inv_beta);
  EXPECT_TRUE(at::equal(fused.isnan(), reference(x, p.alpha, p.inv_beta).isnan()));
  EXPECT_EQ(fused[0][0][2].item<float>(), 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const auto y = at::tensor({0.5f, inf, -inf}).view({1, 1, -1});
  const auto expected = reference(y, p.alpha, p.inv_beta);
  ASSERT_TRUE(expected.isnan().any().item<bool>());
  EXPECT_TRUE(at::equal(snake_beta(y, p.alpha, p.inv_beta).isnan(), expected.isnan()));
  EXPECT_EQ(snake_beta(y, p.alpha, p.inv_beta)[0][0][0].item<float>(),
            expected[0][0][0].item<float>());
}

TEST(SnakeBeta, OtherDtypesAndShapesTakeTheReferenceOps) {
  const auto p = params(3, 8);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto x = at::randn({2, 3, 50}, gen, at::kDouble);
  ASSERT_FALSE(fused_snake_beta_applies(x));
  EXPECT_TRUE(at::equal(snake_beta(x, p.alpha, p.inv_beta), reference(x, p.alpha, p.inv_beta)));
  const auto x4 = at::randn({1, 3, 5, 7}, gen, at::kFloat);
  EXPECT_FALSE(fused_snake_beta_applies(x4));
}

}  // namespace
