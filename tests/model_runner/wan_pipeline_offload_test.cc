// WanPipeline under the engine's offload backends (tests/fixtures/wan22_a14b_pipeline_tiny,
// two experts): every strategy of issue 25 (model-level, layerwise with one or two blocks
// ahead, phase granularity, an offload ratio, the disk tier under a host budget) must give
// bitwise the frames of the resident pipeline, found through the model spec the engine derives
// from the children's names, within the device bound each strategy implies; model-level
// offload must never hold both experts on the device.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "cpu_offload/disk_tier.h"
#include "cpu_offload/model_spec.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/offload_plan.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

using offload::DeviceKind;
using offload::OffloadConfig;
using offload::OffloadStats;
using offload::Strategy;

const std::string kFixtures = std::string(OMNI_FIXTURES_DIR);
const std::string kDir = kFixtures + "/wan22_a14b_pipeline_tiny";
const std::string kTi2vDir = kFixtures + "/wan22_ti2v_pipeline_tiny";

WanRequest request(const std::string& dir = kDir) {
  std::ifstream in(dir + "/reference.json");
  const auto j = nlohmann::json::parse(in);
  WanRequest r;
  r.prompt = j.at("prompt").get<std::string>();
  r.negative_prompt = j.at("negative_prompt").get<std::string>();
  r.height = j.at("height").get<int64_t>();
  r.width = j.at("width").get<int64_t>();
  r.num_frames = j.at("num_frames").get<int64_t>();
  r.num_inference_steps = j.at("num_inference_steps").get<int64_t>();
  r.guidance_scale = j.at("guidance_scale").get<double>();
  if (!j.at("guidance_scale_2").is_null()) {
    r.guidance_scale_2 = j.at("guidance_scale_2").get<double>();
  }
  r.seed = j.at("seed").get<uint64_t>();
  r.max_sequence_length = j.at("max_sequence_length").get<int64_t>();
  if (j.at("image").get<bool>()) {
    // The TI2V fixture's input image: the image-to-video path also runs the VAE encoder.
    r.image = SafetensorsFile::open(dir + "/reference.safetensors").tensor("image");
  }
  return r;
}

size_t param_bytes(torch::nn::Module& m) {
  size_t n = 0;
  for (const auto& p : m.parameters()) n += p.nbytes();
  return n;
}

// Slab bytes the planner counts for a unit: its tensors plus alignment padding for each.
size_t planned_bytes(const offload::UnitPlan& u) {
  return u.bytes + offload::kTensorAlignment * u.tensor_names.size();
}

struct RunResult {
  at::Tensor frames;
  OffloadStats stats;
  std::optional<offload::DiskTierStats> disk;
  size_t transformer_bytes = 0, transformer_2_bytes = 0;
  size_t units = 0, max_planned_unit = 0, streamed_planned_bytes = 0;
  size_t host_after = 0;  // host bytes the engine still holds after the run
  std::vector<std::string> experts;
};

// Where the experts' weights lie in their safetensors files, by name from the pipeline: the
// disk tier reads the streamed blocks from there. Binding again gives the same bytes (the
// loader already viewed the same fp32 files), and load_weights reports their extents.
offload::TensorFiles expert_files(WanPipeline& pipe, const std::string& dir) {
  offload::TensorFiles files;
  const auto t = SafetensorsCheckpoint::open(dir + "/transformer");
  add_disk_files(load_weights(pipe.transformer(), t, ""), "transformer.", files);
  if (pipe.transformer_2() != nullptr) {
    const auto t2 = SafetensorsCheckpoint::open(dir + "/transformer_2");
    add_disk_files(load_weights(*pipe.transformer_2(), t2, ""), "transformer_2.", files);
  }
  return files;
}

RunResult run(DeviceKind device, OffloadConfig config, const std::string& dir = kDir,
              bool disk = false) {
  auto pipe = load_wan_pipeline(dir, at::kFloat);
  RunResult r;
  r.transformer_bytes = param_bytes(pipe->transformer());
  if (pipe->transformer_2() != nullptr) r.transformer_2_bytes = param_bytes(*pipe->transformer_2());
  if (disk) config.disk_files = expert_files(*pipe, dir);
  auto engine = offload::make_transfer_engine(device, {});
  // The pipeline's own spec: the names the engine would find, plus the blocks' phases.
  auto backend = offload::apply_offload(*pipe, pipe->offload_spec(), config, engine);
  for (const auto& u : backend->plan().units) {
    r.max_planned_unit = std::max(r.max_planned_unit, planned_bytes(u));
    r.streamed_planned_bytes += planned_bytes(u);
  }
  r.units = backend->plan().units.size();
  {
    auto scope = backend->forward_scope();
    const auto result = pipe->generate(
        request(dir),
        [&](const WanStep& step) {
          r.experts.push_back(step.transformer);
          return true;
        },
        engine->compute_device());
    r.frames = result.frames;
  }
  r.stats = backend->stats();
  r.disk = backend->disk_stats();
  r.host_after = engine->host_counter()->current();
  return r;
}

// The engine's resident run of a fixture on a device, once per test binary.
const at::Tensor& resident_frames(DeviceKind device, const std::string& dir = kDir) {
  static std::map<std::pair<DeviceKind, std::string>, at::Tensor> cache;
  auto& frames = cache[{device, dir}];
  if (!frames.defined()) {
    frames = run(device, OffloadConfig::for_strategy(Strategy::kNone), dir).frames;
  }
  return frames;
}

class WanPipelineOffload : public ::testing::TestWithParam<std::tuple<DeviceKind, std::string>> {};

// The strategies of issue 25, point 3, by test name.
OffloadConfig config_named(const std::string& name) {
  if (name == "model_level") return OffloadConfig::for_strategy(Strategy::kModelLevel);
  auto c = OffloadConfig::for_strategy(Strategy::kLayerwise);
  if (name == "layerwise") return c;
  if (name == "layerwise_2_gpu_layers") {
    c.num_gpu_layers = 2;
  } else if (name == "phase") {
    c.granularity = offload::Granularity::kPhase;
  } else if (name == "offload_ratio") {
    c.offload_ratio = 0.5;  // the first of each expert's two blocks streams
  } else if (name == "disk_tier") {
    c.disk_read_ahead = 1;  // the budget is set in the test, from the plan
  } else {
    ADD_FAILURE() << "unknown strategy " << name;
  }
  return c;
}

TEST_P(WanPipelineOffload, FramesAreBitwiseEqualToResident) {
  const auto& [device, name] = GetParam();
  OMNI_SKIP_IF_DEVICE_MISSING(device);
  // No offload on the same engine (see ResidentEqualsThePlainPipelineOnAlignedWeights).
  const at::Tensor& expected = resident_frames(device);
  OffloadConfig config = config_named(name);
  size_t budget = 0;
  if (name == "disk_tier") {
    // The smallest cache the tier accepts: window 1 + 1 + read-ahead 1 units, below the four
    // blocks that stream, so blocks are read from the files again and again.
    const RunResult plan = run(device, config_named("layerwise"));
    budget = 3 * plan.max_planned_unit;
    ASSERT_LT(budget, plan.streamed_planned_bytes) << "every block fits the cache: no disk reads";
    config.host_memory_budget_bytes = budget;
  }
  const RunResult r = run(device, config, kDir, name == "disk_tier");
  ASSERT_EQ(r.frames.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(r.frames, expected))
      << name << ": max abs diff " << (r.frames - expected).abs().max().item<double>();
  EXPECT_EQ(r.experts, (std::vector<std::string>{"transformer", "transformer_2"}));
  const auto& s = r.stats;
  std::cout << name << ": peak " << s.peak_device_bytes << " B, resident " << s.resident_bytes
            << " B, largest unit " << s.max_unit_bytes << " B, units " << r.units << ", experts "
            << r.transformer_bytes << " + " << r.transformer_2_bytes << " B of " << s.param_bytes
            << " B, h2d " << s.bytes_h2d << " B\n";
  if (name == "model_level") {
    EXPECT_LT(s.peak_device_bytes, s.param_bytes) << name;
    // The experts take turns: the weights beyond the resident ones never reach both experts'.
    EXPECT_LT(s.peak_device_bytes - s.resident_bytes, r.transformer_bytes + r.transformer_2_bytes);
    EXPECT_LE(s.peak_device_bytes, s.resident_bytes + s.max_unit_bytes);
    return;
  }
  // Layerwise keeps num_gpu_layers + 1 slots, each as large as the largest unit.
  const size_t slots = static_cast<size_t>(config.num_gpu_layers) + 1;
  EXPECT_LE(s.peak_device_bytes, s.resident_bytes + slots * s.max_unit_bytes) << name;
  // ... and never all the streamed units at once, where there are more than slots.
  if (r.units > slots) {
    EXPECT_LT(s.peak_device_bytes - s.resident_bytes, r.streamed_planned_bytes) << name;
  }
  const size_t blocks = 4;  // two per expert
  if (name == "phase") {
    // Each block splits into its phases: more, smaller units than blocks.
    EXPECT_GT(r.units, blocks);
  } else if (name == "offload_ratio") {
    EXPECT_EQ(r.units, blocks / 2);
  } else {
    EXPECT_EQ(r.units, blocks);
  }
  if (name == "disk_tier") {
    ASSERT_TRUE(r.disk.has_value());
    EXPECT_EQ(r.disk->entries, 3u);
    // Every block came from the files (no host slab holds them).
    EXPECT_GE(r.disk->reads, r.units);
    EXPECT_GT(r.disk->read_bytes, 0u);
    // Every host slab and cache entry still held stays within the budget.
    EXPECT_LE(r.host_after, budget);
  } else {
    EXPECT_FALSE(r.disk.has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, WanPipelineOffload,
    ::testing::Combine(::testing::ValuesIn(omni::testing::all_devices()),
                       ::testing::Values("model_level", "layerwise", "layerwise_2_gpu_layers",
                                         "phase", "offload_ratio", "disk_tier")),
    [](const ::testing::TestParamInfo<std::tuple<DeviceKind, std::string>>& param_info) {
      return offload::to_string(std::get<0>(param_info.param)) + "_" +
             std::get<1>(param_info.param);
    });

// TI2V-5B style (one transformer, z48 residual VAE, per-token timesteps, an input image that
// the VAE encoder reads): layerwise over its blocks gives the resident frames bitwise.
TEST(WanPipelineOffloadSpec, Ti2vLayerwiseFramesAreBitwiseEqualToResident) {
  const auto device = DeviceKind::kCpuSim;
  const at::Tensor& expected = resident_frames(device, kTi2vDir);
  const RunResult r =
      run(device, OffloadConfig::for_strategy(Strategy::kLayerwise), kTi2vDir, false);
  ASSERT_EQ(r.frames.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(r.frames, expected)) << (r.frames - expected).abs().max().item<double>();
  EXPECT_EQ(r.experts, (std::vector<std::string>{"transformer", "transformer"}));
  EXPECT_GT(r.units, 0u);
  EXPECT_LE(r.stats.peak_device_bytes, r.stats.resident_bytes + 2 * r.stats.max_unit_bytes);
}

// Four requests (their own prompts, seeds and guidance; one without CFG) denoised together a
// step at a time under layerwise offload: each gives its frames alone bit for bit, and the
// blocks stream once a step for the whole batch, so the denoising's H2D bytes equal one
// request's.
TEST(WanPipelineOffloadSpec, BatchedStepsShareEachBlockVisit) {
  const auto device = DeviceKind::kCpuSim;
  auto pipe = load_wan_pipeline(kDir, at::kFloat);
  auto engine = offload::make_transfer_engine(device, {});
  auto backend = offload::apply_offload(*pipe, pipe->offload_spec(),
                                        OffloadConfig::for_strategy(Strategy::kLayerwise), engine);
  const auto dev = engine->compute_device();
  std::vector<WanRequest> requests(4, request());
  const std::vector<double> guidance = {5.0, 3.0, 1.0, 7.5};
  for (size_t k = 0; k < requests.size(); ++k) {
    requests[k].prompt += " #" + std::to_string(k);
    requests[k].seed = 100 + k;
    requests[k].guidance_scale = guidance[k];
    requests[k].guidance_scale_2 = guidance[k] > 1 ? std::optional<double>(2.0) : std::nullopt;
  }
  auto scope = backend->forward_scope();
  c10::InferenceMode guard;
  // Denoises `batch` together, returning each one's frames and the denoising's H2D bytes.
  const auto denoise = [&](const std::vector<WanRequest>& batch, uint64_t* h2d) {
    std::vector<WanDenoising> states;
    for (const auto& r : batch) states.push_back(pipe->start_denoise(r, pipe->encode(r, dev), dev));
    std::vector<WanDenoising*> running;
    for (auto& s : states) running.push_back(&s);
    const uint64_t before = backend->stats().bytes_h2d;
    while (!states.front().done()) {
      const auto steps = pipe->denoise_step(running);
      EXPECT_EQ(steps.size(), batch.size());
    }
    *h2d = backend->stats().bytes_h2d - before;
    std::vector<at::Tensor> frames;
    for (const auto& s : states) frames.push_back(pipe->decode_latents(pipe->finish_denoise(s)));
    return frames;
  };
  uint64_t alone_h2d = 0, batch_h2d = 0;
  std::vector<at::Tensor> alone;
  for (const auto& r : requests) {
    alone.push_back(denoise({r}, &alone_h2d).front());
    // The step-at-a-time loop is generate()'s.
    EXPECT_TRUE(at::equal(alone.back(), pipe->generate(r, {}, dev).frames));
  }
  const auto batched = denoise(requests, &batch_h2d);
  for (size_t k = 0; k < requests.size(); ++k) {
    EXPECT_TRUE(at::equal(batched[k], alone[k]))
        << k << ": max abs diff " << (batched[k] - alone[k]).abs().max().item<double>();
    if (k > 0) {
      EXPECT_FALSE(at::equal(alone[k], alone[0])) << k;
    }
  }
  EXPECT_GT(alone_h2d, 0u);
  EXPECT_EQ(batch_h2d, alone_h2d);
}

TEST(WanPipelineOffloadSpec, ZeroGpuLayersIsRejected) {
  // layerwise_num_gpu_layers counts the window ahead of the computing unit; 0 would leave no
  // slot to prefetch into, and the config says so instead of running.
  auto c = OffloadConfig::for_strategy(Strategy::kLayerwise);
  c.num_gpu_layers = 0;
  EXPECT_THROW(c.validate(), omni::Error);
}

// The baseline above is the engine's resident run, not the loaded pipeline as is: the loaded
// weights are views of the mmapped safetensors file, some not 64-byte aligned, and CPU kernels
// may round differently on unaligned rows (about 7e-6 here). With its weights copied into
// fresh (aligned) memory the plain pipeline gives the resident run's frames bitwise.
TEST(WanPipelineOffloadSpec, ResidentEqualsThePlainPipelineOnAlignedWeights) {
  auto pipe = load_wan_pipeline(kDir, at::kFloat);
  {
    at::NoGradGuard no_grad;
    for (auto& p : pipe->parameters()) p.set_data(p.clone());
    for (auto& b : pipe->buffers()) b.set_data(b.clone());
  }
  const auto plain = pipe->generate(request()).frames;
  const at::Tensor& resident = resident_frames(DeviceKind::kCpuSim);
  EXPECT_TRUE(at::equal(plain, resident)) << (plain - resident).abs().max().item<double>();
}

TEST(WanPipelineOffloadSpec, ChildrenGiveComponentsAndBlockLists) {
  auto pipe = load_wan_pipeline(kDir, at::kFloat);
  auto spec = offload::resolve_model_spec(*pipe, {});
  EXPECT_EQ(spec.dits, (std::vector<std::string>{"transformer", "transformer_2"}));
  EXPECT_EQ(spec.encoders, (std::vector<std::string>{"text_encoder"}));
  EXPECT_EQ(spec.vaes, (std::vector<std::string>{"vae"}));
  ASSERT_EQ(spec.block_lists.size(), 2u);
  EXPECT_EQ(spec.block_lists[0].path, "transformer.blocks");
  EXPECT_EQ(spec.block_lists[1].path, "transformer_2.blocks");
  // The pipeline's own spec names the same parts, and the phases its blocks call.
  const auto own = pipe->offload_spec();
  EXPECT_EQ(own.dits, spec.dits);
  EXPECT_EQ(own.encoders, spec.encoders);
  EXPECT_EQ(own.vaes, spec.vaes);
  ASSERT_EQ(own.block_lists.size(), 2u);
  EXPECT_EQ(own.block_lists[1].path, "transformer_2.blocks");
  EXPECT_EQ(own.block_lists[1].phases, (std::vector<std::string>{"attn1", "attn2", "ffn"}));
}

}  // namespace
}  // namespace omni::models
