// Offload of the Qwen3-Omni thinker applied by the runner after weight load: component offload
// of visual + audio_tower (alternating, sequential), layerwise streaming of the decoder layers,
// and the memory-pressure (LRU) budget. Each must generate the same tokens as no offload while
// the engine's peak device bytes drop by what it offloads.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../common/test_devices.h"
#include "../common/unit_stats.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

using offload::DeviceKind;
using offload::OffloadStats;
using testing::unit_bytes;
using testing::unit_loads;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
constexpr int64_t kTokens = 32;

ChatRequest multimodal_request() {
  ChatRequest r;
  r.text = "What do you hear and see?";
  r.audio_files = {kDir + "/audio.wav"};
  r.image_files = {kDir + "/image.png"};
  return r;
}

SamplingParams greedy() {
  SamplingParams p;
  p.greedy = true;
  p.max_new_tokens = kTokens;
  return p;
}

std::unique_ptr<ThinkerRunner> load(DeviceKind kind, const ThinkerOffloadOptions& offload = {}) {
  ThinkerRunnerOptions options;
  options.model_dir = kDir;
  options.offload = offload;
  return ThinkerRunner::load(options, offload::make_transfer_engine(kind));
}

ThinkerOffloadOptions components(const std::string& strategy, size_t budget = 0) {
  ThinkerOffloadOptions o;
  o.cpu_offload_enabled = true;
  o.components = {"visual", "audio_tower"};
  o.strategy = strategy;
  o.device_budget_bytes = budget;
  return o;
}

struct Baseline {
  std::vector<int64_t> tokens;
  size_t peak = 0;
};

// No offload on `kind`: the tokens every strategy must reproduce, and the peak to beat.
const Baseline& baseline(DeviceKind kind) {
  static std::map<DeviceKind, Baseline> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  auto runner = load(kind);
  Baseline b;
  b.tokens = runner->generate(runner->prepare(multimodal_request()), greedy()).tokens;
  b.peak = runner->offload().stats().peak_device_bytes;
  return cache.emplace(kind, b).first->second;
}

class Qwen3OmniOffload : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(Qwen3OmniOffload, BaselineIsTheHfReferenceOnCpuAndUsesEveryWeight) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  ASSERT_EQ(b.tokens.size(), static_cast<size_t>(kTokens));
  auto runner = load(GetParam());
  const auto s = runner->offload().stats();
  // Everything resident, in one buffer: the weights plus their 256-byte alignment padding.
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes);
  EXPECT_GE(s.resident_bytes, s.param_bytes);
  EXPECT_LT(s.resident_bytes, s.param_bytes + 256 * runner->model().parameters().size());
  if (GetParam() == DeviceKind::kCpuSim) {
    auto ref = SafetensorsFile::open(kDir + "/reference.safetensors").tensor("mm_generated");
    std::vector<int64_t> expected(ref.data_ptr<int64_t>(), ref.data_ptr<int64_t>() + kTokens);
    EXPECT_EQ(b.tokens, expected);
  }
}

TEST_P(Qwen3OmniOffload, ComponentsAlternatingAndSequentialKeepTokensAndCutThePeak) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  for (const char* strategy : {"alternating", "sequential"}) {
    SCOPED_TRACE(strategy);
    auto runner = load(GetParam(), components(strategy));
    EXPECT_EQ(runner->generate(runner->prepare(multimodal_request()), greedy()).tokens, b.tokens);
    const auto s = runner->offload().stats();
    const size_t visual = unit_bytes(s, "visual"), audio = unit_bytes(s, "audio_tower");
    EXPECT_GE(visual, static_cast<size_t>(runner->module_bytes("visual")));
    EXPECT_GE(audio, static_cast<size_t>(runner->module_bytes("audio_tower")));
    // One offloaded component at a time next to the resident language model: the peak drops
    // by at least the smaller component (both were resident in the baseline).
    EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + std::max(visual, audio));
    EXPECT_LE(
        s.peak_device_bytes + static_cast<size_t>(std::min(runner->module_bytes("visual"),
                                                           runner->module_bytes("audio_tower"))),
        b.peak);
    EXPECT_EQ(unit_loads(s, "audio_tower"), 1u);
    EXPECT_EQ(unit_loads(s, "visual"), 1u);
    // The host slabs are the only host copy of the offloaded weights (the mmap is gone).
    EXPECT_LE(s.host_bytes, visual + audio);
    // Sequential: both left after their forward. Alternating: visual (ran last) stays.
    EXPECT_EQ(s.current_device_bytes,
              s.resident_bytes + (std::string(strategy) == "sequential" ? 0 : visual));
  }
}

TEST_P(Qwen3OmniOffload, LayerwiseDecoderLayersKeepTokensAndHoldTwoLayers) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  ThinkerOffloadOptions o;
  o.layerwise = true;
  o.num_gpu_layers = 1;
  o.layerwise_encoders = false;
  auto runner = load(GetParam(), o);
  EXPECT_EQ(runner->generate(runner->prepare(multimodal_request()), greedy()).tokens, b.tokens);
  const auto s = runner->offload().stats();
  ASSERT_EQ(s.units.size(), 3u);
  EXPECT_EQ(s.units[0].name, "model.layers.0");
  size_t layers = 0;
  for (const auto& u : s.units) layers += u.bytes;
  // N = 1: the computing layer and the one being prefetched.
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + 2 * s.max_unit_bytes);
  EXPECT_LT(s.peak_device_bytes, b.peak);
  EXPECT_LE(s.peak_device_bytes + layers - 2 * s.max_unit_bytes, b.peak + 3 * 256);
  // Every layer streams once per forward (the prefill and 31 decode steps), each prefetched in
  // time; the last layer of the last step already prefetched layer 0 for a next forward.
  EXPECT_EQ(s.loads, 3u * kTokens + 1);
  EXPECT_EQ(s.sync_loads, 0u);
}

TEST_P(Qwen3OmniOffload, LayerwiseWithEncoderLayersSharesTheSlotsAndLowersThePeakFurther) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  ThinkerOffloadOptions o;
  o.layerwise = true;
  o.num_gpu_layers = 1;
  auto runner = load(GetParam(), o);
  const auto inputs = runner->prepare(multimodal_request());
  EXPECT_EQ(runner->generate(inputs, greedy()).tokens, b.tokens);
  auto s = runner->offload().stats();
  ASSERT_EQ(s.units.size(), 3u + 2u + 4u);  // decoder layers, audio layers, vision blocks
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + 2 * s.max_unit_bytes);
  // The encoders' layers left the device: below the decoder-only layerwise peak.
  o.layerwise_encoders = false;
  const auto decoder_only = load(GetParam(), o)->offload().stats();
  EXPECT_LT(s.resident_bytes + 2 * s.max_unit_bytes,
            decoder_only.resident_bytes + 2 * decoder_only.max_unit_bytes);
  // The audio and vision layers run once per request: a second request loads each once more.
  const uint64_t audio_loads = unit_loads(s, "audio_tower.layers.0");
  EXPECT_EQ(runner->generate(inputs, greedy()).tokens, b.tokens);
  s = runner->offload().stats();
  EXPECT_EQ(unit_loads(s, "audio_tower.layers.0"), audio_loads + 1);
  EXPECT_EQ(unit_loads(s, "visual.blocks.3"), 2u);
}

TEST_P(Qwen3OmniOffload, BudgetBelowAllComponentsEvictsLeastRecentlyUsed) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  // Sizes from a first load; then a budget that holds the decoder and one encoder, not both.
  size_t resident = 0, visual = 0, audio = 0;
  {
    auto probe = load(GetParam(), components("sequential"));
    const auto s = probe->offload().stats();
    resident = s.resident_bytes;
    visual = unit_bytes(s, "visual");
    audio = unit_bytes(s, "audio_tower");
  }
  const size_t budget = resident + std::max(visual, audio);
  ASSERT_LT(budget, resident + visual + audio);
  auto runner = load(GetParam(), components("alternating", budget));
  const auto inputs = runner->prepare(multimodal_request());
  EXPECT_EQ(runner->generate(inputs, greedy()).tokens, b.tokens);
  auto s = runner->offload().stats();
  EXPECT_LE(s.peak_device_bytes, budget);
  EXPECT_EQ(s.current_device_bytes, resident + visual);  // audio was evicted for visual
  // A second request: audio (least recently used) comes back and evicts visual, then visual
  // evicts audio again.
  EXPECT_EQ(runner->generate(inputs, greedy()).tokens, b.tokens);
  s = runner->offload().stats();
  EXPECT_LE(s.peak_device_bytes, budget);
  EXPECT_EQ(unit_loads(s, "audio_tower"), 2u);
  EXPECT_EQ(unit_loads(s, "visual"), 2u);
}

TEST_P(Qwen3OmniOffload, EnsureOnDeviceForAHandOff) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto runner = load(GetParam(), components("sequential"));
  runner->generate(runner->prepare(multimodal_request()), greedy());
  auto before = runner->offload().stats();
  EXPECT_EQ(before.current_device_bytes, before.resident_bytes);
  runner->offload().ensure_on_device("audio_tower");
  auto after = runner->offload().stats();
  EXPECT_EQ(after.current_device_bytes, after.resident_bytes + unit_bytes(after, "audio_tower"));
}

// Every name docs/offload.md documents for the thinker works as a component (these failed with "not
// a HookableModule" before the text decoder and lm_head became hookable components).
TEST_P(Qwen3OmniOffload, EveryDocumentedComponentNameKeepsTheTokens) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& b = baseline(GetParam());
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"language_model"}, {"model"}},
      {{"lm_head"}, {"lm_head"}},
      {{"thinker.*"}, {"audio_tower", "visual", "model", "lm_head"}},
      {{"thinker.visual", "thinker.audio_tower"}, {"visual", "audio_tower"}},
      {{"language_model.layers.*"}, {"model.layers.0", "model.layers.2"}},
  };
  for (const auto& [names, units] : cases) {
    for (const char* strategy : {"alternating", "sequential"}) {
      SCOPED_TRACE(names.front() + std::string(" ") + strategy);
      ThinkerOffloadOptions o = components(strategy);
      o.components = names;
      auto runner = load(GetParam(), o);
      EXPECT_EQ(runner->generate(runner->prepare(multimodal_request()), greedy()).tokens, b.tokens);
      const auto s = runner->offload().stats();
      for (const auto& unit : units) EXPECT_GE(unit_loads(s, unit), 1u) << unit;
    }
  }
}

TEST(Qwen3OmniOffloadNames, StageConfigNamesMapOntoThinkerModules) {
  EXPECT_EQ(thinker_component_paths({"visual", "thinker.audio_tower", "language_model",
                                     "language_model.layers.*", "thinker.*"}),
            (std::vector<std::string>{"visual", "audio_tower", "model", "model.layers.*", "*"}));
  EXPECT_THROW(thinker_component_paths({""}), Error);
  // A name that matches nothing is refused at load, naming the modules that exist.
  ThinkerOffloadOptions o = components("alternating");
  o.components = {"vision_tower"};
  try {
    load(DeviceKind::kCpuSim, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vision_tower"), std::string::npos) << e.what();
  }
  o.components = {"visual"};
  o.strategy = "round-robin";
  EXPECT_THROW(load(DeviceKind::kCpuSim, o), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, Qwen3OmniOffload, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_name);

}  // namespace
}  // namespace omni::models
