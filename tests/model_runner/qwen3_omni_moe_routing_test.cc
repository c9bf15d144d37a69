// SparseMoe's device-side routing (tokens sorted by expert on the device, one copy to the host
// per forward) against the per-expert loop it replaced, on random fp32 weights: with and
// without the talker's shared expert, top-k 1, 2 and 4 of 8 experts, 1, 3 and 64 rows, experts
// that get no token and tokens that all pick the same expert. Also route_tokens on its own.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/moe_routing.h"
#include "model_runner/qwen3_omni/text_model.h"

namespace omni::models::qwen3_omni {
namespace {

constexpr int64_t kHidden = 32;
constexpr int64_t kExperts = 8;

TextConfig moe_config(int64_t top_k, bool shared_expert) {
  TextConfig cfg;
  cfg.hidden_size = kHidden;
  cfg.num_experts = kExperts;
  cfg.num_experts_per_tok = top_k;
  cfg.moe_intermediate_size = 16;
  cfg.norm_topk_prob = true;
  cfg.shared_expert_intermediate_size = shared_expert ? 24 : 0;
  return cfg;
}

std::shared_ptr<SparseMoe> random_moe(const TextConfig& cfg, uint64_t seed) {
  auto moe = std::make_shared<SparseMoe>(cfg, at::kFloat);
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : moe->named_parameters()) p.value().normal_(0.0, 0.3, gen);
  return moe;
}

// SparseMoe::forward before device-side routing (the Hugging Face reference's loop): for each
// hit expert, its (token, slot) pairs by nonzero, its MLP on those tokens, and index_add_ of the
// weighted outputs. Returns the output and the experts it ran.
std::pair<at::Tensor, std::set<int64_t>> reference_forward(SparseMoe& moe, const TextConfig& cfg,
                                                           const at::Tensor& x) {
  const auto params = moe.named_parameters();
  auto linear = [&](const std::string& name, const at::Tensor& in) {
    return at::linear(in, params[name + ".weight"]);
  };
  auto mlp = [&](const std::string& prefix, const at::Tensor& in) {
    return linear(prefix + ".down_proj",
                  at::silu(linear(prefix + ".gate_proj", in)) * linear(prefix + ".up_proj", in));
  };
  auto flat = x.reshape({-1, x.size(-1)});
  auto router_logits = linear("gate", flat);
  auto probs = at::softmax(router_logits, -1, at::kFloat);
  auto [top_values, top_index] = at::topk(probs, cfg.num_experts_per_tok, -1);
  if (cfg.norm_topk_prob) top_values = top_values / top_values.sum(-1, /*keepdim=*/true);
  top_values = top_values.to(router_logits.scalar_type());

  auto out = at::zeros_like(flat);
  std::set<int64_t> ran;
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    auto where = at::nonzero(top_index == e);  // [n, 2]: token, slot
    if (where.size(0) == 0) continue;
    ran.insert(e);
    auto token_idx = where.select(1, 0);
    auto slot_idx = where.select(1, 1);
    auto y = mlp("experts." + std::to_string(e), flat.index_select(0, token_idx));
    auto weights = top_values.flatten()
                       .index_select(0, token_idx * cfg.num_experts_per_tok + slot_idx)
                       .unsqueeze(-1);
    out.index_add_(0, token_idx, y * weights);
  }
  if (cfg.shared_expert_intermediate_size > 0) {
    out = out + at::sigmoid(linear("shared_expert_gate", flat)) * mlp("shared_expert", flat);
  }
  return {out.view(x.sizes()), ran};
}

// top_k, shared expert, rows.
class MoeRoutingTest : public ::testing::TestWithParam<std::tuple<int64_t, bool, int64_t>> {};

TEST_P(MoeRoutingTest, EqualsThePerExpertLoop) {
  const auto [top_k, shared_expert, rows] = GetParam();
  const auto cfg = moe_config(top_k, shared_expert);
  auto moe = random_moe(cfg, 1000 + 10 * top_k + rows + (shared_expert ? 5 : 0));
  auto gen = at::detail::createCPUGenerator(7 + rows);
  const auto x = at::randn({1, rows, kHidden}, gen);

  const auto out = moe->forward(x);
  const auto [expected, ran] = reference_forward(*moe, cfg, x);
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double diff = (out - expected).abs().max().item<double>();
  std::cout << "top_k " << top_k << (shared_expert ? " shared" : "") << " rows " << rows
            << ": max abs diff vs per-expert loop " << diff << "\n";
  EXPECT_LE(diff, 1e-5);

  // Few rows route as decode, the rest as prefill; one copy to the host in either case, and
  // one expert call per hit expert (not per expert, not per token).
  const bool decode = rows * top_k <= kExperts;
  const auto stats = moe->stats();
  EXPECT_EQ(stats.decode_forwards, decode ? 1 : 0);
  EXPECT_EQ(stats.prefill_forwards, decode ? 0 : 1);
  EXPECT_EQ(stats.host_copies, 1);
  EXPECT_EQ(stats.expert_calls, static_cast<int64_t>(ran.size()));
  if (rows == 1) {  // some experts get no token
    EXPECT_LT(stats.expert_calls, kExperts);
  }
}

INSTANTIATE_TEST_SUITE_P(TopKSharedRows, MoeRoutingTest,
                         ::testing::Combine(::testing::Values(int64_t{1}, int64_t{2}, int64_t{4}),
                                            ::testing::Bool(),
                                            ::testing::Values(int64_t{1}, int64_t{3}, int64_t{64})),
                         [](const auto& param_info) {
                           return "top" + std::to_string(std::get<0>(param_info.param)) +
                                  (std::get<1>(param_info.param) ? "_shared" : "") + "_rows" +
                                  std::to_string(std::get<2>(param_info.param));
                         });

// A router that sends every token to expert 5 first: one expert takes all 64 rows.
TEST(MoeRouting, EveryTokenPicksTheSameExpert) {
  for (int64_t top_k : {1, 2}) {
    const auto cfg = moe_config(top_k, /*shared_expert=*/false);
    auto moe = random_moe(cfg, 42);
    auto router = moe->named_parameters()["gate.weight"];
    router.zero_();
    router[5].fill_(1.0);
    auto gen = at::detail::createCPUGenerator(3);
    const auto x = at::rand({1, 64, kHidden}, gen) + 0.5;  // positive: expert 5 wins by far

    const auto out = moe->forward(x);
    const auto [expected, ran] = reference_forward(*moe, cfg, x);
    EXPECT_LE((out - expected).abs().max().item<double>(), 1e-5);
    EXPECT_TRUE(ran.count(5));
    if (top_k == 1) {
      EXPECT_EQ(ran.size(), 1u);
    }
    EXPECT_EQ(moe->stats().expert_calls, static_cast<int64_t>(ran.size()));
    EXPECT_EQ(moe->stats().prefill_forwards, 1);
  }
}

TEST(MoeRouting, NoTokensGiveAnEmptyOutput) {
  auto moe = random_moe(moe_config(2, /*shared_expert=*/true), 9);
  const auto out = moe->forward(at::zeros({1, 0, kHidden}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 0, kHidden}));
  EXPECT_EQ(moe->stats().expert_calls, 0);
}

// Three tokens, top-2 of experts {1, 2, 3} (given by weight, not in expert order): the sorted
// rows group by expert, in token order within one, and the experts without a token are left out.
void expect_grouped(int64_t num_experts, MoeRouting::Plan plan) {
  const auto top_index = at::tensor({3, 1, 1, 3, 3, 2}, at::kLong).view({3, 2});
  const auto top_weights = at::tensor({0.7f, 0.3f, 0.6f, 0.4f, 0.9f, 0.1f}).view({3, 2});
  const auto routing = route_tokens(top_index, top_weights, num_experts);
  EXPECT_EQ(routing.plan, plan);
  EXPECT_EQ(routing.host_copies, 1);
  ASSERT_EQ(routing.experts.size(), 3u);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> want = {{1, 0, 2}, {2, 2, 3}, {3, 3, 6}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(routing.experts[i].expert, std::get<0>(want[i]));
    EXPECT_EQ(routing.experts[i].begin, std::get<1>(want[i]));
    EXPECT_EQ(routing.experts[i].end, std::get<2>(want[i]));
  }
  // Sorted rows: expert 1 (tokens 0, 1), expert 2 (token 2), expert 3 (tokens 0, 1, 2); each
  // token's experts in increasing order in the [tokens, top_k] layout.
  EXPECT_TRUE(at::equal(routing.tokens, at::tensor({0, 1, 2, 0, 1, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(routing.order, at::tensor({0, 2, 4, 1, 3, 5}, at::kLong)));
  EXPECT_TRUE(at::allclose(routing.weights, at::tensor({0.3f, 0.6f, 0.1f, 0.7f, 0.4f, 0.9f})));

  // Outputs of the sorted rows = the row's index + 1: token t sums its two rows' weighted values.
  const auto sorted_outputs = (at::arange(6, at::kFloat) + 1).unsqueeze(-1).repeat({1, 2});
  const auto out = combine_expert_outputs(sorted_outputs.clone(), routing);
  const auto want_out = at::tensor({0.3f * 1 + 0.7f * 4, 0.6f * 2 + 0.4f * 5, 0.1f * 3 + 0.9f * 6})
                            .unsqueeze(-1)
                            .repeat({1, 2});
  EXPECT_TRUE(at::allclose(out, want_out)) << out;
}

TEST(MoeRouting, FewRowsRouteAsDecode) { expect_grouped(8, MoeRouting::Plan::kDecode); }

TEST(MoeRouting, ManyRowsRouteAsPrefill) { expect_grouped(4, MoeRouting::Plan::kPrefill); }

}  // namespace
}  // namespace omni::models::qwen3_omni
