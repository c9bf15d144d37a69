// The backends run the tiny diffusion pipeline and must produce bitwise the same images as
// the resident model, within the memory bounds their accounting promises.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "cpu_offload/offload_backend.h"
#include "model_runner/diffusion/tiny_pipeline.h"

namespace omni::offload {
namespace {

using models::DiTBlock;
using models::GenerateOptions;
using models::TinyDiffusionConfig;
using models::TinyDiffusionPipeline;

constexpr int kSteps = 3;

TinyDiffusionConfig pipeline_config(bool two_transformers = false) {
  TinyDiffusionConfig c;
  c.seed = 7;
  c.two_transformers = two_transformers;
  return c;
}

GenerateOptions generate_options() {
  GenerateOptions o;
  o.steps = kSteps;
  o.guidance_scale = 3.0;
  o.seed = 11;
  return o;
}

at::Tensor prompt() { return models::example_prompt(2, 6, 64, 1); }
at::Tensor negative() { return models::example_prompt(2, 6, 64, 2); }

// The image without any engine: the plain module on the CPU.
at::Tensor plain_image(bool two_transformers) {
  TinyDiffusionPipeline pipe(pipeline_config(two_transformers));
  return pipe.generate(prompt(), negative(), generate_options(), c10::Device(c10::kCPU));
}

struct RunResult {
  at::Tensor image;
  OffloadStats stats;
};

RunResult run(DeviceKind device, const OffloadConfig& config, bool two_transformers = false,
              double bandwidth = 0) {
  TinyDiffusionPipeline pipe(pipeline_config(two_transformers));
  TransferEngineOptions options;
  options.sim_bandwidth_bytes_per_s = bandwidth;
  auto engine = make_transfer_engine(device, options);
  auto backend = apply_offload(pipe, pipe.offload_spec(), config, engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  RunResult r;
  r.image = pipe.generate(prompt(), negative(), generate_options(), engine->compute_device()).cpu();
  r.stats = backend->stats();
  return r;
}

struct Case {
  std::string name;
  OffloadConfig config;
  bool two_transformers = false;
  // Loads that were not prefetched. Model-level swaps without a budget are synchronous by
  // design; layerwise with two DiTs misses once, when the second DiT takes over.
  int expected_sync_loads = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"resident", OffloadConfig::for_strategy(Strategy::kNone)});
  // encoders, then the DiT (the VAE stays resident)
  out.push_back({"model_level", OffloadConfig::for_strategy(Strategy::kModelLevel), false, 2});
  auto strict = OffloadConfig::for_strategy(Strategy::kModelLevel);
  strict.strict_vae = true;
  out.push_back({"model_level_strict_vae", strict, false, 3});
  out.push_back(
      {"model_level_two_dits", OffloadConfig::for_strategy(Strategy::kModelLevel), true, 3});
  auto budget = OffloadConfig::for_strategy(Strategy::kModelLevel);
  budget.device_budget_bytes = size_t{1} << 30;  // room to prefetch the next group
  // Only the first group waits; each next one arrives while the previous one computes.
  out.push_back({"model_level_prefetch", budget, true, 1});
  out.push_back({"layerwise_n1", OffloadConfig::for_strategy(Strategy::kLayerwise)});
  auto n2 = OffloadConfig::for_strategy(Strategy::kLayerwise);
  n2.num_gpu_layers = 2;
  out.push_back({"layerwise_n2", n2});
  auto phase = OffloadConfig::for_strategy(Strategy::kLayerwise);
  phase.granularity = Granularity::kPhase;
  out.push_back({"layerwise_phase", phase});
  auto ratio = OffloadConfig::for_strategy(Strategy::kLayerwise);
  ratio.offload_ratio = 0.5;
  out.push_back({"layerwise_ratio_half", ratio});
  out.push_back({"layerwise_two_dits", OffloadConfig::for_strategy(Strategy::kLayerwise), true, 1});
  return out;
}

class BackendEquality : public ::testing::TestWithParam<std::tuple<DeviceKind, Case>> {};

TEST_P(BackendEquality, ImageIsBitwiseEqualToTheResidentModel) {
  const auto& [device, c] = GetParam();
  OMNI_SKIP_IF_DEVICE_MISSING(device);
  const RunResult r = run(device, c.config, c.two_transformers);
  at::Tensor expected;
  if (device == DeviceKind::kCpuSim) {
    expected = plain_image(c.two_transformers);
  } else {
    expected = run(device, OffloadConfig::for_strategy(Strategy::kNone), c.two_transformers).image;
  }
  ASSERT_EQ(r.image.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(r.image, expected))
      << "max abs diff " << (r.image - expected).abs().max().item<double>();
  EXPECT_EQ(r.stats.sync_loads, static_cast<uint64_t>(c.expected_sync_loads));
  // No weight is held twice in host memory.
  EXPECT_LE(static_cast<double>(r.stats.host_bytes), 1.05 * r.stats.param_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, BackendEquality,
    ::testing::Combine(::testing::ValuesIn(omni::testing::all_devices()),
                       ::testing::ValuesIn(cases())),
    [](const ::testing::TestParamInfo<std::tuple<DeviceKind, Case>>& param_info) {
      return to_string(std::get<0>(param_info.param)) + "_" + std::get<1>(param_info.param).name;
    });

class BackendMemory : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(BackendMemory, LayerwiseWindowOfOneHoldsResidentPlusTwoUnits) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const RunResult r = run(GetParam(), OffloadConfig::for_strategy(Strategy::kLayerwise));
  const auto& s = r.stats;
  EXPECT_LE(s.peak_device_bytes, s.resident_bytes + 2 * s.max_unit_bytes);
  EXPECT_GT(s.max_unit_bytes, 0u);
  EXPECT_LT(s.peak_device_bytes, s.param_bytes);
  // 8 blocks x 3 steps x 2 guidance passes, each streamed once and prefetched, plus the
  // wrap-around prefetch of block 0 for a next step.
  EXPECT_EQ(s.loads, 8u * kSteps * 2 + 1);
  EXPECT_EQ(s.sync_loads, 0u);
  // Units move as whole slabs; resident weights stream tensor by tensor, without the
  // alignment padding between them.
  const uint64_t resident_copied = s.bytes_h2d - s.loads * s.max_unit_bytes;
  EXPECT_LE(resident_copied, s.resident_bytes);
  EXPECT_GT(resident_copied, s.resident_bytes - s.resident_bytes / 100);
}

TEST_P(BackendMemory, LayerwiseWindowOfTwoHoldsResidentPlusThreeUnits) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.num_gpu_layers = 2;
  const auto& s = run(GetParam(), config).stats;
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + 3 * s.max_unit_bytes);
}

TEST_P(BackendMemory, PhaseGranularityUsesSmallerSlots) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto block = run(GetParam(), OffloadConfig::for_strategy(Strategy::kLayerwise)).stats;
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.granularity = Granularity::kPhase;
  const auto phase = run(GetParam(), config).stats;
  EXPECT_LT(phase.max_unit_bytes, block.max_unit_bytes / 2);
  EXPECT_LE(phase.peak_device_bytes, phase.resident_bytes + 2 * phase.max_unit_bytes);
  EXPECT_EQ(phase.units.size(), 24u);
}

TEST_P(BackendMemory, ModelLevelHoldsResidentPlusLargestGroup) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (bool two : {false, true}) {
    const auto s = run(GetParam(), OffloadConfig::for_strategy(Strategy::kModelLevel), two).stats;
    EXPECT_LE(s.peak_device_bytes, s.resident_bytes + s.max_unit_bytes) << "two DiTs: " << two;
    EXPECT_LT(s.peak_device_bytes, s.param_bytes);
  }
}

TEST_P(BackendMemory, ModelLevelPrefetchStaysWithinTheBudget) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto strict =
      run(GetParam(), OffloadConfig::for_strategy(Strategy::kModelLevel), true).stats;
  auto config = OffloadConfig::for_strategy(Strategy::kModelLevel);
  config.device_budget_bytes = strict.resident_bytes + 2 * strict.max_unit_bytes;
  const auto s = run(GetParam(), config, true).stats;
  EXPECT_LE(s.peak_device_bytes, config.device_budget_bytes);
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + 2 * s.max_unit_bytes);
  // One byte short of two groups: strict exclusion again.
  config.device_budget_bytes -= 1;
  const auto tight = run(GetParam(), config, true).stats;
  EXPECT_EQ(tight.peak_device_bytes, tight.resident_bytes + tight.max_unit_bytes);
  config.device_budget_bytes = 1;
  EXPECT_THROW(run(GetParam(), config, true), Error);
}

TEST_P(BackendMemory, ResidentHoldsEverything) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto s = run(GetParam(), OffloadConfig::for_strategy(Strategy::kNone)).stats;
  EXPECT_EQ(s.resident_bytes, s.peak_device_bytes);
  EXPECT_GE(s.peak_device_bytes, s.param_bytes);
  EXPECT_LE(static_cast<double>(s.peak_device_bytes), 1.05 * s.param_bytes);
  EXPECT_EQ(s.host_bytes, 0u);  // resident weights keep no host copy
}

INSTANTIATE_TEST_SUITE_P(Devices, BackendMemory, ::testing::ValuesIn(omni::testing::all_devices()),
                         omni::testing::device_name);

TEST(LayerwiseBackend, BlockRunOutOfOrderIsLoadedSynchronouslyAndComputesCorrectly) {
  TinyDiffusionPipeline reference(pipeline_config());
  TinyDiffusionPipeline pipe(pipeline_config());
  auto engine = make_cpu_sim_engine({});
  auto backend = apply_offload(pipe, pipe.offload_spec(),
                               OffloadConfig::for_strategy(Strategy::kLayerwise), engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  c10::InferenceMode inference;
  const auto x = at::randn({1, 16, 64});
  const auto ctx = at::randn({1, 6, 64});
  const auto temb = at::randn({1, 6, 64});
  for (int b : {5, 2, 7, 5}) {
    const std::string path = "transformer.blocks." + std::to_string(b);
    auto* block = dynamic_cast<DiTBlock*>(find_module(pipe, path).get());
    auto* ref_block = dynamic_cast<DiTBlock*>(find_module(reference, path).get());
    ASSERT_NE(block, nullptr);
    EXPECT_TRUE(at::equal(block->forward(x, ctx, temb), ref_block->forward(x, ctx, temb))) << b;
  }
  const auto s = backend->stats();
  EXPECT_GE(s.sync_loads, 2u);  // 5 and 2 were not next in line
  EXPECT_LE(s.peak_device_bytes, s.resident_bytes + 2 * s.max_unit_bytes);
  // A normal run afterwards is still exact.
  backend->reset_stats();
  const auto image =
      pipe.generate(prompt(), negative(), generate_options(), engine->compute_device());
  EXPECT_TRUE(at::equal(image, plain_image(false)));
}

TEST(LayerwiseBackend, AFailedForwardLeavesTheEngineConsistent) {
  TinyDiffusionPipeline pipe(pipeline_config());
  auto engine = make_cpu_sim_engine({});
  auto backend = apply_offload(pipe, pipe.offload_spec(),
                               OffloadConfig::for_strategy(Strategy::kLayerwise), engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  auto* block = dynamic_cast<DiTBlock*>(find_module(pipe, "transformer.blocks.5").get());
  ASSERT_NE(block, nullptr);
  {
    c10::InferenceMode inference;
    const auto bad = at::randn({1, 16, 63});  // wrong width: the block's matmul throws
    EXPECT_THROW(block->forward(bad, at::randn({1, 6, 64}), at::randn({1, 6, 64})), c10::Error);
  }
  backend->reset_stats();
  const auto image =
      pipe.generate(prompt(), negative(), generate_options(), engine->compute_device());
  EXPECT_TRUE(at::equal(image, plain_image(false)));
  // Block 5 was released by the error path: the ring streams normally again (at most the
  // first block had to be fetched, the slots held blocks 5 and 6).
  EXPECT_LE(backend->stats().sync_loads, 1u);
}

TEST(LayerwiseBackend, CopiesOverlapComputeAndStallsAreCounted) {
  // A slow simulated link: copies take long enough that compute has to wait for some.
  const RunResult slow = run(DeviceKind::kCpuSim, OffloadConfig::for_strategy(Strategy::kLayerwise),
                             false, /*bandwidth=*/20e6);
  EXPECT_TRUE(at::equal(slow.image, plain_image(false)));
  EXPECT_GT(slow.stats.stall_ms, 0.0);
  EXPECT_GT(slow.stats.copy_ms, 0.0);
  double unit_compute = 0, unit_copy = 0;
  for (const auto& u : slow.stats.units) {
    // Block 0 is also prefetched once more at the end, for a next step.
    const uint64_t extra = u.name == "transformer.blocks.0" ? 1 : 0;
    EXPECT_EQ(u.loads, static_cast<uint64_t>(kSteps * 2) + extra) << u.name;
    unit_compute += u.compute_ms;
    unit_copy += u.copy_ms;
  }
  EXPECT_GT(unit_compute, 0.0);
  EXPECT_GT(unit_copy, 0.0);
  // The copy stream works while blocks compute: total copy time is not all stall.
  EXPECT_LT(slow.stats.stall_ms, slow.stats.copy_ms);
}

TEST(ModelLevelBackend, EnsureOnDeviceSwapsInTheGroup) {
  TinyDiffusionPipeline pipe(pipeline_config());
  auto engine = make_cpu_sim_engine({});
  auto backend = apply_offload(pipe, pipe.offload_spec(),
                               OffloadConfig::for_strategy(Strategy::kModelLevel), engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  pipe.generate(prompt(), negative(), generate_options(), engine->compute_device());
  const auto encoder_weight = pipe.named_parameters()["text_encoder.embed.weight"];
  const auto dit_weight = pipe.named_parameters()["transformer.patch_embed.weight"];
  EXPECT_EQ(encoder_weight.numel(), 0);  // the DiT ran last
  backend->ensure_on_device("text_encoder");
  EXPECT_EQ(encoder_weight.numel(), 64 * 64);
  EXPECT_EQ(dit_weight.numel(), 0);  // mutual exclusion holds
  const auto s = backend->stats();
  EXPECT_LE(s.peak_device_bytes, s.resident_bytes + s.max_unit_bytes);
}

// Pinning fails (the simulated device's pinned memory runs out, as cudaHostAlloc would): a
// layerwise backend refuses pageable slabs, whose copies could not overlap compute, unless
// pinning was turned off; the module is left as it was.
TEST(ApplyOffload, LayerwiseRefusesUnpinnedSlabsUnlessPinningIsOff) {
  TransferEngineOptions options;
  options.sim_pinned_limit_bytes = 64 << 10;  // far below one block
  {
    TinyDiffusionPipeline pipe(pipeline_config());
    auto engine = make_cpu_sim_engine(options);
    try {
      apply_offload(pipe, pipe.offload_spec(), OffloadConfig::for_strategy(Strategy::kLayerwise),
                    engine);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pinning"), std::string::npos) << what;
      EXPECT_NE(what.find("transformer.blocks.0"), std::string::npos) << what;
      EXPECT_NE(what.find("pin_memory = false"), std::string::npos) << what;
    }
  }
  TinyDiffusionPipeline pipe(pipeline_config());
  auto engine = make_cpu_sim_engine(options);
  auto config = OffloadConfig::for_strategy(Strategy::kLayerwise);
  config.pin_memory = false;
  auto backend = apply_offload(pipe, pipe.offload_spec(), config, engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  const auto image =
      pipe.generate(prompt(), negative(), generate_options(), c10::Device(c10::kCPU));
  EXPECT_TRUE(at::equal(image, plain_image(false)));
}

TEST(ApplyOffload, StatsJsonNamesTheFigures) {
  const auto s = run(DeviceKind::kCpuSim, OffloadConfig::for_strategy(Strategy::kLayerwise)).stats;
  const std::string json = s.to_json(true);
  for (const char* key : {"\"strategy\": \"layerwise\"", "\"peak_device_bytes\"", "\"stall_ms\"",
                          "\"units\": [{\"name\": \"transformer.blocks.0\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

}  // namespace
}  // namespace omni::offload
