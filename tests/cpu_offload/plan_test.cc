// The offload plan: which tensors stream, which stay, and the errors for bad settings.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "cpu_offload/check.h"
#include "cpu_offload/offload_plan.h"
#include "model_runner/diffusion/tiny_pipeline.h"

namespace omni::offload {
namespace {

using models::TinyDiffusionConfig;
using models::TinyDiffusionPipeline;

std::vector<std::string> unit_names(const OffloadPlan& plan) {
  std::vector<std::string> names;
  for (const auto& u : plan.units) names.push_back(u.name);
  return names;
}

bool resident(const OffloadPlan& plan, const std::string& tensor) {
  return std::find(plan.resident_tensors.begin(), plan.resident_tensors.end(), tensor) !=
         plan.resident_tensors.end();
}

TEST(OffloadPlan, LayerwiseStreamsBlocksAndKeepsTheRestResident) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  auto plan = make_offload_plan(pipe, pipe.offload_spec(),
                                OffloadConfig::for_strategy(Strategy::kLayerwise));
  EXPECT_EQ(plan.strategy, Strategy::kLayerwise);
  ASSERT_EQ(plan.units.size(), 8u);
  EXPECT_EQ(plan.units[3].name, "transformer.blocks.3");
  EXPECT_TRUE(resident(plan, "transformer.patch_embed.weight"));
  EXPECT_TRUE(resident(plan, "text_encoder.embed.weight"));
  EXPECT_TRUE(resident(plan, "vae.conv_out.bias"));
  EXPECT_FALSE(resident(plan, "transformer.blocks.0.ffn.fc1.weight"));
  size_t total = plan.resident_bytes;
  for (const auto& u : plan.units) total += u.bytes;
  EXPECT_EQ(total, plan.param_bytes);
}

TEST(OffloadPlan, OffloadRatioStreamsThatFractionOfEachBlockList) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.offload_ratio = 0.5;
  auto plan = make_offload_plan(pipe, pipe.offload_spec(), config);
  EXPECT_EQ(unit_names(plan),
            (std::vector<std::string>{"transformer.blocks.0", "transformer.blocks.1",
                                      "transformer.blocks.2", "transformer.blocks.3"}));
  EXPECT_TRUE(resident(plan, "transformer.blocks.4.ffn.fc1.weight"));
  config.offload_ratio = 0.0;
  EXPECT_TRUE(make_offload_plan(pipe, pipe.offload_spec(), config).units.empty());
}

TEST(OffloadPlan, PhaseGranularitySplitsBlocksAndKeepsBlockLevelTensorsResident) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.granularity = Granularity::kPhase;
  auto plan = make_offload_plan(pipe, pipe.offload_spec(), config);
  ASSERT_EQ(plan.units.size(), 24u);
  EXPECT_EQ(plan.units[0].name, "transformer.blocks.0.self_attn");
  EXPECT_EQ(plan.units[1].name, "transformer.blocks.0.cross_attn");
  EXPECT_EQ(plan.units[2].name, "transformer.blocks.0.ffn");
  EXPECT_TRUE(resident(plan, "transformer.blocks.0.modulation"));
}

TEST(OffloadPlan, ModelLevelGroupsEncodersAndEachDit) {
  auto c = TinyDiffusionConfig{};
  c.two_transformers = true;
  TinyDiffusionPipeline pipe(c);
  auto plan = make_offload_plan(pipe, pipe.offload_spec(),
                                OffloadConfig::for_strategy(Strategy::kModelLevel));
  ASSERT_EQ(plan.groups.size(), 3u);
  EXPECT_EQ(plan.groups[0].name, "encoders");
  EXPECT_EQ(plan.groups[1].name, "transformer");
  EXPECT_EQ(plan.groups[2].name, "transformer_2");
  EXPECT_TRUE(resident(plan, "vae.conv_in.weight"));
  auto strict = OffloadConfig::for_strategy(Strategy::kModelLevel);
  strict.strict_vae = true;
  auto strict_plan = make_offload_plan(pipe, pipe.offload_spec(), strict);
  ASSERT_EQ(strict_plan.groups.size(), 4u);
  EXPECT_EQ(strict_plan.groups[3].name, "vae");
  EXPECT_FALSE(resident(strict_plan, "vae.conv_in.weight"));
}

TEST(OffloadPlan, TiedTensorsAreStoredOnceAndStayResidentWhenSplit) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  // Tie a block weight to a resident module's parameter, like tied embeddings.
  auto shared = pipe.named_parameters()["transformer.patch_embed.bias"];
  auto block = find_module(pipe, "transformer.blocks.0.ffn");
  block->register_parameter("tied", shared, false);
  auto plan = make_offload_plan(pipe, pipe.offload_spec(),
                                OffloadConfig::for_strategy(Strategy::kLayerwise));
  EXPECT_TRUE(resident(plan, "transformer.patch_embed.bias"));
  for (const auto& u : plan.units) {
    for (const auto& t : u.tensor_names) EXPECT_NE(t, "transformer.blocks.0.ffn.tied");
  }
  size_t total = plan.resident_bytes;
  for (const auto& u : plan.units) total += u.bytes;
  EXPECT_EQ(total, plan.param_bytes);  // counted once
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OffloadPlan, InvalidSettingsGetClearErrors) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.num_gpu_layers = 0;
  EXPECT_NE(error_of([&] {
              make_offload_plan(pipe, pipe.offload_spec(), config);
            }).find("num_gpu_layers must be >= 1, got 0"),
            std::string::npos);
  config.num_gpu_layers = 1;
  config.offload_ratio = 1.5;
  EXPECT_NE(error_of([&] {
              make_offload_plan(pipe, pipe.offload_spec(), config);
            }).find("offload_ratio must be in [0, 1], got 1.5"),
            std::string::npos);
  config.offload_ratio = 1.0;
  auto spec = pipe.offload_spec();
  spec.block_lists = {{"transformer.blokcs", {}}};
  EXPECT_NE(error_of([&] {
              make_offload_plan(pipe, spec, config);
            }).find("unknown block list 'transformer.blokcs'"),
            std::string::npos);
  EXPECT_THROW(parse_strategy("sequential"), Error);
  EXPECT_THROW(parse_granularity("layer"), Error);
}

TEST(OffloadConfig, EveryStrategyNameRoundTrips) {
  for (auto s :
       {Strategy::kNone, Strategy::kModelLevel, Strategy::kLayerwise, Strategy::kComponent}) {
    EXPECT_EQ(parse_strategy(to_string(s)), s) << to_string(s);
  }
}

TEST(OffloadPlan, ModelLevelWithoutEncodersFallsBackToResidentWithAWarning) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  auto spec = pipe.offload_spec();
  spec.encoders.clear();
  ::testing::internal::CaptureStderr();
  auto plan = make_offload_plan(pipe, spec, OffloadConfig::for_strategy(Strategy::kModelLevel));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(plan.strategy, Strategy::kNone);
  EXPECT_TRUE(plan.groups.empty());
  EXPECT_EQ(plan.resident_bytes, plan.param_bytes);
  EXPECT_NE(err.find("nothing to alternate with"), std::string::npos) << err;
}

TEST(OffloadPlan, LayerwiseWinsWhenBothAreEnabled) {
  TinyDiffusionPipeline pipe(TinyDiffusionConfig{});
  OffloadConfig config;
  config.model_level = true;
  config.layerwise = true;
  ::testing::internal::CaptureStderr();
  auto plan = make_offload_plan(pipe, pipe.offload_spec(), config);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(plan.strategy, Strategy::kLayerwise);
  EXPECT_NE(err.find("layerwise wins"), std::string::npos) << err;
}

TEST(ModelSpec, FallbackScanFindsComponentsByNameWithAWarning) {
  auto c = TinyDiffusionConfig{};
  c.two_transformers = true;
  TinyDiffusionPipeline pipe(c);
  ::testing::internal::CaptureStderr();
  const ModelSpec spec = resolve_model_spec(pipe, ModelSpec{});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(spec.dits, (std::vector<std::string>{"transformer", "transformer_2"}));
  EXPECT_EQ(spec.encoders, (std::vector<std::string>{"text_encoder"}));
  EXPECT_EQ(spec.vaes, (std::vector<std::string>{"vae"}));
  ASSERT_EQ(spec.block_lists.size(), 2u);
  EXPECT_EQ(spec.block_lists[1].path, "transformer_2.blocks");
  EXPECT_NE(err.find("declares no offload components"), std::string::npos) << err;
  // A declared spec is taken as it is, silently.
  ::testing::internal::CaptureStderr();
  resolve_model_spec(pipe, pipe.offload_spec());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace omni::offload
