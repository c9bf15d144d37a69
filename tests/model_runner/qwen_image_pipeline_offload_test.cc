// QwenImagePipeline under the engine's offload backends (tests/fixtures/qwen_image_pipeline_tiny
// with true CFG): model-level, layerwise with one or two blocks ahead, phase granularity, an
// offload ratio and the disk tier must give bitwise the images of the resident pipeline, within
// the device bound each strategy implies, and stream each block once a step for both guidance
// passes; model-level must never hold the text encoder and the transformer on the device
// together. The same for an edit (qwen_image_edit_pipeline_tiny, its
// vision tower a second encoder) under model-level, layerwise and the disk tier.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/test_devices.h"
#include "cpu_offload/disk_tier.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/offload_plan.h"
#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

using offload::DeviceKind;
using offload::OffloadConfig;
using offload::OffloadStats;
using offload::Strategy;

const std::string kFixtures = OMNI_FIXTURES_DIR;

// "t2i": text-to-image with true CFG; "edit": an edit of one image with true CFG.
std::string folder(const std::string& pipeline) {
  return kFixtures +
         (pipeline == "edit" ? "/qwen_image_edit_pipeline_tiny" : "/qwen_image_pipeline_tiny");
}

QwenImageRequest request(const std::string& pipeline) {
  QwenImageRequest r;
  r.prompt = "A red fox sitting by a café, golden hour light.";
  r.negative_prompt = "blurry, low quality";
  r.height = 48;
  r.width = 32;
  r.num_inference_steps = 2;
  r.seed = 11;
  if (pipeline == "edit") r.images.push_back(read_image_file(folder(pipeline) + "/image_a.png"));
  return r;
}

size_t param_bytes(torch::nn::Module& m) {
  size_t n = 0;
  for (const auto& p : m.parameters()) n += p.nbytes();
  return n;
}

size_t planned_bytes(const offload::UnitPlan& u) {
  return u.bytes + offload::kTensorAlignment * u.tensor_names.size();
}

struct RunResult {
  at::Tensor images;
  OffloadStats stats;
  std::optional<offload::DiskTierStats> disk;
  size_t text_encoder_bytes = 0, transformer_bytes = 0;
  size_t units = 0, max_planned_unit = 0, streamed_planned_bytes = 0;
  size_t host_after = 0;
};

RunResult run(const std::string& pipeline, DeviceKind device, OffloadConfig config,
              bool disk = false) {
  const std::string dir = folder(pipeline);
  auto pipe = load_qwen_image_pipeline(dir, at::kFloat);
  RunResult r;
  r.text_encoder_bytes = param_bytes(pipe->text_encoder());
  if (pipe->vision().tower) r.text_encoder_bytes += param_bytes(*pipe->vision().tower);
  r.transformer_bytes = param_bytes(pipe->transformer());
  if (disk) {
    // Where the transformer's weights lie in its safetensors file: the disk tier reads the
    // streamed blocks from there.
    const auto t = SafetensorsCheckpoint::open(dir + "/transformer");
    add_disk_files(load_weights(pipe->transformer(), t, ""), "transformer.", config.disk_files);
  }
  auto engine = offload::make_transfer_engine(device, {});
  auto backend = offload::apply_offload(*pipe, pipe->offload_spec(), config, engine);
  for (const auto& u : backend->plan().units) {
    r.max_planned_unit = std::max(r.max_planned_unit, planned_bytes(u));
    r.streamed_planned_bytes += planned_bytes(u);
  }
  r.units = backend->plan().units.size();
  {
    auto scope = backend->forward_scope();
    r.images = pipe->generate(request(pipeline), {}, engine->compute_device()).images;
  }
  r.stats = backend->stats();
  r.disk = backend->disk_stats();
  r.host_after = engine->host_counter()->current();
  return r;
}

const at::Tensor& resident_images(const std::string& pipeline, DeviceKind device) {
  static std::map<std::pair<std::string, DeviceKind>, at::Tensor> cache;
  auto& images = cache[{pipeline, device}];
  if (!images.defined()) {
    images = run(pipeline, device, OffloadConfig::for_strategy(Strategy::kNone)).images;
  }
  return images;
}

OffloadConfig config_named(const std::string& name) {
  if (name == "model_level") return OffloadConfig::for_strategy(Strategy::kModelLevel);
  auto c = OffloadConfig::for_strategy(Strategy::kLayerwise);
  if (name == "layerwise_2_gpu_layers") c.num_gpu_layers = 2;
  if (name == "phase") c.granularity = offload::Granularity::kPhase;
  if (name == "offload_ratio") c.offload_ratio = 0.5;  // the first two of the four blocks stream
  if (name == "disk_tier") c.disk_read_ahead = 1;
  return c;
}

using Param = std::tuple<std::string, DeviceKind, std::string>;
class QwenImagePipelineOffload : public ::testing::TestWithParam<Param> {};

TEST_P(QwenImagePipelineOffload, ImagesAreBitwiseEqualToResident) {
  const auto& [pipeline, device, name] = GetParam();
  OMNI_SKIP_IF_DEVICE_MISSING(device);
  const at::Tensor& expected = resident_images(pipeline, device);
  OffloadConfig config = config_named(name);
  size_t budget = 0;
  if (name == "disk_tier") {
    // The smallest cache the tier accepts (window 1 + 1 + read-ahead 1 units): below the
    // streamed blocks, so they are read from the file again and again.
    const RunResult plan = run(pipeline, device, config_named("layerwise"));
    budget = 3 * plan.max_planned_unit;
    config.host_memory_budget_bytes = budget;
  }
  const RunResult r = run(pipeline, device, config, name == "disk_tier");
  ASSERT_EQ(r.images.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(r.images, expected))
      << name << ": max abs diff " << (r.images - expected).abs().max().item<double>();
  const auto& s = r.stats;
  std::cout << pipeline << " " << name << ": peak " << s.peak_device_bytes << " B, resident "
            << s.resident_bytes << " B, largest unit " << s.max_unit_bytes << " B, units "
            << r.units << ", text encoder " << r.text_encoder_bytes << " B, transformer "
            << r.transformer_bytes << " B of " << s.param_bytes << " B, h2d " << s.bytes_h2d
            << " B\n";
  if (name == "model_level") {
    // Text encoder and transformer take turns: never both on the device.
    EXPECT_LT(s.peak_device_bytes - s.resident_bytes, r.text_encoder_bytes + r.transformer_bytes);
    EXPECT_LE(s.peak_device_bytes, s.resident_bytes + s.max_unit_bytes);
    return;
  }
  const size_t slots = static_cast<size_t>(config.num_gpu_layers) + 1;
  EXPECT_LE(s.peak_device_bytes, s.resident_bytes + slots * s.max_unit_bytes) << name;
  // Both guidance passes share each block's visit: one copy of the streamed units a step (and
  // the next step's first ones prefetched), not one a pass.
  const auto steps = static_cast<size_t>(request(pipeline).num_inference_steps);
  EXPECT_LE(s.bytes_h2d,
            s.resident_bytes + steps * r.streamed_planned_bytes + slots * s.max_unit_bytes)
      << name;
  const size_t blocks = 4;
  if (name == "phase") {
    EXPECT_EQ(r.units, blocks * QwenImageTransformer2DModel::block_phases().size());
  } else if (name == "offload_ratio") {
    EXPECT_EQ(r.units, blocks / 2);
  } else {
    EXPECT_EQ(r.units, blocks);
  }
  if (name == "disk_tier") {
    ASSERT_TRUE(r.disk.has_value());
    EXPECT_GE(r.disk->reads, r.units);
    EXPECT_GT(r.disk->read_bytes, 0u);
    EXPECT_LE(r.host_after, budget);
  } else {
    EXPECT_FALSE(r.disk.has_value());
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_" + offload::to_string(std::get<1>(info.param)) + "_" +
         std::get<2>(info.param);
}

INSTANTIATE_TEST_SUITE_P(TextToImage, QwenImagePipelineOffload,
                         ::testing::Combine(::testing::Values("t2i"),
                                            ::testing::ValuesIn(omni::testing::all_devices()),
                                            ::testing::Values("model_level", "layerwise",
                                                              "layerwise_2_gpu_layers", "phase",
                                                              "offload_ratio", "disk_tier")),
                         param_name);

INSTANTIATE_TEST_SUITE_P(
    Edit, QwenImagePipelineOffload,
    ::testing::Combine(::testing::Values("edit"), ::testing::ValuesIn(omni::testing::all_devices()),
                       ::testing::Values("model_level", "layerwise", "disk_tier")),
    param_name);

}  // namespace
}  // namespace omni::models
