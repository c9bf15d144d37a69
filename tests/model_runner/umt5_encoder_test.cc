// The UMT5 text encoder of Wan2.1 / Wan2.2 against transformers 5.24.0's UMT5EncoderModel
// (tests/fixtures/umt5_tiny, written by make_umt5_fixture.py): two right-padded prompts, one
// longer than relative_attention_max_distance; then the relative position buckets, the
// hookable blocks, and the errors for a missing weight and an unsupported config.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/umt5_encoder.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/umt5_tiny";

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(UMT5Encoder, MatchesTransformers) {
  c10::InferenceMode guard;
  const auto model = load_umt5_encoder(kDir);
  EXPECT_EQ(model->config().d_model, 32);
  EXPECT_EQ(model->config().num_layers, 2);
  EXPECT_EQ(model->config().relative_attention_num_buckets, 32);
  EXPECT_EQ(model->config().relative_attention_max_distance, 128);

  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  const at::Tensor ids = ref.tensor("input_ids");
  const at::Tensor mask = ref.tensor("attention_mask");
  const at::Tensor expected = ref.tensor("last_hidden_state");
  const at::Tensor out = model->forward(ids, mask);
  ASSERT_EQ(out.sizes(), expected.sizes());
  ASSERT_EQ(out.scalar_type(), at::kFloat);

  double worst = 0;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const int64_t n = mask[b].sum().item<int64_t>();
    const double diff = max_abs_diff(out[b].slice(0, 0, n), expected[b].slice(0, 0, n));
    std::cout << "prompt " << b << " (" << n << " tokens): max abs diff vs transformers " << diff
              << "\n";
    EXPECT_LE(diff, 1e-5) << "prompt " << b;
    worst = std::max(worst, diff);

    // Alone and unpadded, the prompt gives the same hidden states.
    const at::Tensor alone = model->forward(ids[b].slice(0, 0, n).unsqueeze(0));
    EXPECT_LE(max_abs_diff(alone[0], expected[b].slice(0, 0, n)), 1e-5) << "prompt " << b;
  }
  std::cout << "max abs diff vs transformers: " << worst << "\n";
}

TEST(UMT5Encoder, RelativePositionBuckets) {
  // transformers' _relative_position_bucket (32 buckets, max distance 128, bidirectional) of
  // key - query for these distances.
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 0},   {1, 17},   {-1, 1},   {-7, 7},   {7, 23},    {8, 24},   {-8, 8},
      {20, 26}, {-20, 10}, {127, 31}, {128, 31}, {-128, 15}, {200, 31}, {-200, 15}};
  const at::Tensor buckets = umt5_relative_position_buckets(201, 401, 32, 128, at::kCPU);
  ASSERT_EQ(buckets.sizes(), (std::vector<int64_t>{201, 401}));
  for (const auto& [distance, bucket] : expected) {
    // query 200, key 200 + distance
    EXPECT_EQ(buckets[200][200 + distance].item<int64_t>(), bucket) << "distance " << distance;
  }
}

TEST(UMT5Encoder, BlocksAreHookable) {
  const auto model = load_umt5_encoder(kDir);
  ASSERT_EQ(model->num_blocks(), 2);
  for (const char* path : {"encoder.block.0", "encoder.block.1"}) {
    offload::HookableModule& block = offload::find_hookable(*model, path);
    EXPECT_EQ(&block, &model->block(path[14] - '0')) << path;
  }
  const auto params = model->named_parameters();
  EXPECT_TRUE(
      params.contains("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  EXPECT_TRUE(params.contains("encoder.block.1.layer.1.DenseReluDense.wi_0.weight"));
  EXPECT_TRUE(params.contains("encoder.final_layer_norm.weight"));
  EXPECT_TRUE(params.contains("shared.weight"));
}

class UMT5EncoderErrors : public testing::TempDirTest {
 protected:
  // The fixture's config.json with `edit` applied, and its weights less `drop`.
  void copy_fixture(const std::function<void(nlohmann::json&)>& edit, const std::string& drop) {
    nlohmann::json config = nlohmann::json::parse(testing::read_bytes(kDir + "/config.json"));
    edit(config);
    testing::write_bytes(path("config.json"), config.dump(2));
    const auto weights = SafetensorsFile::open(kDir + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : weights.names()) {
      if (name != drop) tensors.emplace_back(name, weights.tensor(name));
    }
    write_safetensors(path("model.safetensors"), tensors);
  }
};

TEST_F(UMT5EncoderErrors, MissingWeightIsNamed) {
  const std::string missing =
      "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight";
  copy_fixture([](nlohmann::json&) {}, missing);
  const std::string error = error_of([&] { load_umt5_encoder(dir()); });
  EXPECT_CONTAINS(error, missing);
}

TEST_F(UMT5EncoderErrors, UnsupportedFeedForwardIsNamed) {
  copy_fixture([](nlohmann::json& c) { c["feed_forward_proj"] = "gated-silu"; }, "");
  const std::string error = error_of([&] { load_umt5_encoder(dir()); });
  EXPECT_CONTAINS(error, "feed_forward_proj");
  EXPECT_CONTAINS(error, "gated-silu");
  EXPECT_CONTAINS(error, path("config.json"));
}

TEST_F(UMT5EncoderErrors, MissingConfigFieldIsNamed) {
  copy_fixture([](nlohmann::json& c) { c.erase("d_kv"); }, "");
  const std::string error = error_of([&] { load_umt5_encoder(dir()); });
  EXPECT_CONTAINS(error, "d_kv");
  EXPECT_CONTAINS(error, path("config.json"));
}

}  // namespace
}  // namespace omni::models
