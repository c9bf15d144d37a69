// Component offload on a small autoregressive "omni" model (audio tower + vision encoder +
// decoder): the same tokens as without offload, peak device bytes within the policy's bound,
// least-recently-used eviction under a budget, device buffers reused across loads, and the
// host and allocator peaks in the stats.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <set>
#include <string>

#include "../common/test_devices.h"
#include "../common/unit_stats.h"
#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "cpu_offload/offload_backend.h"
#include "model_runner/layers.h"

namespace omni::offload {
namespace {

using models::Embedding;
using models::Linear;
using omni::testing::unit_bytes;
using omni::testing::unit_loads;
constexpr int64_t kDim = 64, kVocab = 96;

class Encoder : public HookableModule {
 public:
  Encoder(int64_t in, int64_t hidden, at::Generator& gen) : HookableModule("Encoder") {
    fc1_ = register_module("fc1", std::make_shared<Linear>(in, hidden, gen, at::kFloat));
    fc2_ = register_module("fc2", std::make_shared<Linear>(hidden, kDim, gen, at::kFloat));
  }
  at::Tensor forward(const at::Tensor& x) {
    return invoke("forward", {x},
                  [this](HookArgs& a) -> c10::IValue {
                    return fc2_->forward(at::gelu(fc1_->forward(a[0].toTensor())));
                  })
        .toTensor();
  }

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
};

class Layer : public HookableModule {
 public:
  explicit Layer(at::Generator& gen) : HookableModule("Layer") {
    fc1_ = register_module("fc1", std::make_shared<Linear>(kDim, 4 * kDim, gen, at::kFloat));
    fc2_ = register_module("fc2", std::make_shared<Linear>(4 * kDim, kDim, gen, at::kFloat));
  }
  at::Tensor forward(const at::Tensor& x) {
    return invoke("forward", {x},
                  [this](HookArgs& a) -> c10::IValue {
                    const auto& h = a[0].toTensor();
                    return h + fc2_->forward(at::silu(fc1_->forward(h)));
                  })
        .toTensor();
  }

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
};

class Decoder : public HookableModule {
 public:
  explicit Decoder(at::Generator& gen) : HookableModule("Decoder") {
    embed_ = register_module("embed", std::make_shared<Embedding>(kVocab, kDim, gen, at::kFloat));
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) layers_->push_back(std::make_shared<Layer>(gen));
    head_ = register_module("head", std::make_shared<Linear>(kDim, kVocab, gen, at::kFloat));
  }
  // Logits of the next token after prefix embeddings and tokens.
  at::Tensor forward(const at::Tensor& prefix, const at::Tensor& tokens) {
    return invoke("forward", {prefix, tokens},
                  [this](HookArgs& a) -> c10::IValue {
                    auto x = at::cat({a[0].toTensor(), embed_->forward(a[1].toTensor())}, 1);
                    x = x.cumsum(1) / at::arange(1, x.size(1) + 1, x.options()).view({1, -1, 1});
                    for (const auto& layer : *layers_) x = layer->as<Layer>()->forward(x);
                    return head_->forward(x.select(1, -1));
                  })
        .toTensor();
  }

 private:
  std::shared_ptr<Embedding> embed_;
  torch::nn::ModuleList layers_;
  std::shared_ptr<Linear> head_;
};

class TinyOmni : public torch::nn::Module {
 public:
  TinyOmni() : torch::nn::Module("TinyOmni") {
    at::Generator gen = at::detail::createCPUGenerator(5);
    audio_tower = register_module("audio_tower", std::make_shared<Encoder>(16, 128, gen));
    visual = register_module("visual", std::make_shared<Encoder>(32, 256, gen));
    language_model = register_module("language_model", std::make_shared<Decoder>(gen));
  }
  // Greedy generation of `n` tokens after an audio + image + text prompt.
  std::vector<int64_t> generate(int n, c10::Device device, uint64_t seed = 3) {
    c10::InferenceMode inference;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const auto audio = at::randn({1, 5, 16}, gen, at::TensorOptions(at::kFloat)).to(device);
    const auto image = at::randn({1, 4, 32}, gen, at::TensorOptions(at::kFloat)).to(device);
    auto tokens = at::randint(kVocab, {1, 3}, gen, at::TensorOptions(at::kLong)).to(device);
    const auto prefix = at::cat({audio_tower->forward(audio), visual->forward(image)}, 1);
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) {
      const auto next = language_model->forward(prefix, tokens).argmax(-1, /*keepdim=*/true);
      out.push_back(next.item<int64_t>());
      tokens = at::cat({tokens, next}, 1);
    }
    return out;
  }
  std::shared_ptr<Encoder> audio_tower, visual;
  std::shared_ptr<Decoder> language_model;
};

const std::vector<int64_t>& reference_tokens() {
  static const std::vector<int64_t> tokens = TinyOmni().generate(32, c10::Device(c10::kCPU));
  return tokens;
}

std::vector<int64_t> reference_tokens_prefix(size_t n) {
  return {reference_tokens().begin(), reference_tokens().begin() + n};
}

OffloadConfig component_config(std::vector<std::string> components, ComponentPolicy policy,
                               size_t budget = 0) {
  auto config = OffloadConfig::for_strategy(Strategy::kComponent);
  config.components = std::move(components);
  config.component_policy = policy;
  config.device_budget_bytes = budget;
  return config;
}

class ComponentOffload : public ::testing::TestWithParam<DeviceKind> {};

TEST(ComponentOffloadModel, ReferenceTokensAreNotDegenerate) {
  // Equality tests below mean something only if the tokens depend on the weights.
  const auto& tokens = reference_tokens();
  ASSERT_EQ(tokens.size(), 32u);
  EXPECT_GE(std::set<int64_t>(tokens.begin(), tokens.end()).size(), 4u);
  EXPECT_NE(TinyOmni().generate(32, c10::Device(c10::kCPU), /*seed=*/4), tokens);
}

TEST_P(ComponentOffload, SameTokensAndPeakDropsByTheOffloadedComponents) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (auto policy : {ComponentPolicy::kAlternating, ComponentPolicy::kSequential}) {
    SCOPED_TRACE(to_string(policy));
    TinyOmni model;
    auto engine = make_transfer_engine(GetParam());
    auto backend =
        apply_offload(model, {}, component_config({"visual", "audio_tower"}, policy), engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    EXPECT_EQ(model.generate(32, engine->compute_device()), reference_tokens());
    const auto s = backend->stats();
    const size_t visual = unit_bytes(s, "visual"), audio = unit_bytes(s, "audio_tower");
    // One component on the device at a time, next to the resident decoder.
    EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + std::max(visual, audio));
    EXPECT_LE(s.peak_device_bytes + std::min(visual, audio), s.param_bytes + 1024);
    EXPECT_EQ(unit_loads(s, "visual"), 1u);
    EXPECT_EQ(unit_loads(s, "audio_tower"), 1u);
    // Sequential: nothing offloaded stays after its forward. Alternating: the last one stays.
    EXPECT_EQ(s.current_device_bytes,
              s.resident_bytes + (policy == ComponentPolicy::kSequential ? 0 : visual));
  }
}

TEST_P(ComponentOffload, DecoderLayersAsComponentsByGlob) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(
      model, {}, component_config({"language_model.layers.*"}, ComponentPolicy::kAlternating),
      engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  EXPECT_EQ(model.generate(8, engine->compute_device()), reference_tokens_prefix(8));
  const auto s = backend->stats();
  ASSERT_EQ(s.units.size(), 3u);
  EXPECT_EQ(s.units[2].name, "language_model.layers.2");
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + s.max_unit_bytes);
  EXPECT_EQ(s.loads, 3u * 8);  // every layer, every step: they alternate
}

TEST_P(ComponentOffload, BudgetEvictsLeastRecentlyUsedAndPeakStaysUnderIt) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const std::vector<std::string> parts = {"audio_tower", "visual", "language_model.layers.1"};
  // Measure the sizes once, then give a budget that holds any two of the three.
  size_t resident = 0, a = 0, v = 0, l = 0;
  {
    TinyOmni model;
    auto backend = apply_offload(model, {}, component_config(parts, ComponentPolicy::kSequential),
                                 make_transfer_engine(GetParam()));
    auto forward = backend->forward_scope();  // every forward runs in it
    const auto s = backend->stats();
    resident = s.resident_bytes;
    a = unit_bytes(s, "audio_tower");
    v = unit_bytes(s, "visual");
    l = unit_bytes(s, "language_model.layers.1");
  }
  const size_t budget = resident + a + v + l - std::min({a, v, l});
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(
      model, {}, component_config(parts, ComponentPolicy::kAlternating, budget), engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  // audio, visual, then the layer evicts audio (least recently used); visual stays.
  EXPECT_EQ(model.generate(32, engine->compute_device()), reference_tokens());
  auto s = backend->stats();
  EXPECT_LE(s.peak_device_bytes, budget);
  EXPECT_EQ(unit_loads(s, "audio_tower"), 1u);
  EXPECT_EQ(unit_loads(s, "visual"), 1u);
  EXPECT_EQ(unit_loads(s, "language_model.layers.1"), 1u);  // stays for all 32 steps
  EXPECT_EQ(s.current_device_bytes, resident + v + l);
  // A second request: audio comes back and evicts visual (used before the layer); then
  // visual comes back and evicts the layer; the layer then evicts audio.
  EXPECT_EQ(model.generate(32, engine->compute_device()), reference_tokens());
  s = backend->stats();
  EXPECT_LE(s.peak_device_bytes, budget);
  EXPECT_EQ(unit_loads(s, "audio_tower"), 2u);
  EXPECT_EQ(unit_loads(s, "visual"), 2u);
  EXPECT_EQ(unit_loads(s, "language_model.layers.1"), 2u);
}

TEST_P(ComponentOffload, WithRoomForEverythingNothingMovesTwice) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(
      model, {},
      component_config({"visual", "audio_tower"}, ComponentPolicy::kAlternating, size_t{1} << 30),
      engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(model.generate(32, engine->compute_device()), reference_tokens());
  EXPECT_EQ(backend->stats().loads, 2u);
}

TEST_P(ComponentOffload, EnsureOnDeviceBeforeAHandOff) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(
      model, {}, component_config({"visual", "audio_tower"}, ComponentPolicy::kSequential), engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  model.generate(2, engine->compute_device());
  const auto before = backend->stats();
  EXPECT_EQ(before.current_device_bytes, before.resident_bytes);
  const auto weight = model.named_parameters()["visual.fc1.weight"];
  EXPECT_EQ(weight.numel(), 0);  // offloaded: an empty placeholder
  backend->ensure_on_device("visual");
  EXPECT_EQ(weight.numel(), 32 * 256);
  EXPECT_EQ(weight.device(), engine->compute_device());
  const auto after = backend->stats();
  EXPECT_EQ(after.current_device_bytes, after.resident_bytes + unit_bytes(after, "visual"));
  EXPECT_THROW(backend->ensure_on_device("visul"), Error);
}

// What a stage pipeline's device ledger does to an idle stage: everything offloaded that is on
// the device goes back to the host (resident weights stay); the next forward loads it again and
// computes the same tokens.
TEST_P(ComponentOffload, ReleaseDeviceGivesBackEveryLoadedComponent) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(model, {},
                               component_config({"visual", "audio_tower", "language_model"},
                                                ComponentPolicy::kAlternating, size_t{1} << 30),
                               engine);
  auto forward = backend->forward_scope();   // every forward runs in it
  EXPECT_EQ(backend->release_device(), 0u);  // nothing loaded yet
  EXPECT_EQ(model.generate(8, engine->compute_device()), reference_tokens_prefix(8));
  const auto loaded = backend->stats();
  const size_t offloaded = unit_bytes(loaded, "visual") + unit_bytes(loaded, "audio_tower") +
                           unit_bytes(loaded, "language_model");
  EXPECT_EQ(loaded.current_device_bytes, loaded.resident_bytes + offloaded);
  EXPECT_EQ(engine->counters().cache_returns, 0u);  // nothing was freed
  EXPECT_EQ(backend->release_device(), offloaded);
  // The freed memory left this process's allocator cache too (another process may want it).
  EXPECT_EQ(engine->counters().cache_returns, 1u);
  const auto released = backend->stats();
  EXPECT_EQ(released.current_device_bytes, released.resident_bytes);
  EXPECT_EQ(model.named_parameters()["visual.fc1.weight"].numel(), 0);
  EXPECT_EQ(model.generate(8, engine->compute_device()), reference_tokens_prefix(8));
  EXPECT_EQ(backend->stats().loads, loaded.loads + 3);
}

// Equal-sized components taking turns (the decoder's layers) load into the buffers that the
// ones before them left: after the first round the engine allocates nothing more, whether they
// alternate one at a time (no budget) or two share a budget (LRU).
TEST_P(ComponentOffload, EqualSizedComponentsReuseTheBuffersTheOthersLeft) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (size_t held : {1, 2}) {  // layers on the device at once
    SCOPED_TRACE(held);
    size_t resident = 0, layer = 0;
    {
      TinyOmni model;
      auto backend = apply_offload(
          model, {}, component_config({"language_model.layers.*"}, ComponentPolicy::kSequential),
          make_transfer_engine(GetParam()));
      const auto s = backend->stats();
      resident = s.resident_bytes;
      layer = s.max_unit_bytes;
    }
    TinyOmni model;
    auto engine = make_transfer_engine(GetParam());
    auto backend =
        apply_offload(model, {},
                      component_config({"language_model.layers.*"}, ComponentPolicy::kAlternating,
                                       held == 1 ? 0 : resident + held * layer),
                      engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    EXPECT_EQ(model.generate(1, engine->compute_device()), reference_tokens_prefix(1));
    const uint64_t first_round = engine->memory_counter()->allocations();
    const auto first = backend->stats();
    EXPECT_EQ(first.loads, 3u);
    EXPECT_EQ(first.buffer_reuses, 3u - held);
    EXPECT_EQ(model.generate(8, engine->compute_device()), reference_tokens_prefix(8));
    const auto s = backend->stats();
    EXPECT_EQ(engine->memory_counter()->allocations(), first_round);  // fails without reuse
    EXPECT_EQ(s.loads, 3u + 3u * 8);
    EXPECT_EQ(s.buffer_reuses, s.loads - held);  // every load but the first `held`
    EXPECT_EQ(s.peak_device_bytes, resident + held * layer);
    EXPECT_EQ(s.current_device_bytes, resident + held * layer);
    EXPECT_NE(s.to_json().find("\"buffer_reuses\": " + std::to_string(s.buffer_reuses)),
              std::string::npos);
    // reset_stats restarts the count; release_device frees the buffers, spares included.
    backend->reset_stats();
    EXPECT_EQ(backend->stats().buffer_reuses, 0u);
    EXPECT_EQ(backend->release_device(), held * layer);
    EXPECT_EQ(backend->stats().current_device_bytes, resident);
  }
}

// A small component never takes a much larger spare (kSpareSlack): it would hold bytes it does
// not need, and under a budget another component would be evicted for them. Audio (41 KB) and
// visual (100 KB) alternate with a buffer each time; each figure stays as without reuse.
TEST_P(ComponentOffload, ComponentsOfDifferentSizesDoNotShareBuffers) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  TinyOmni model;
  auto engine = make_transfer_engine(GetParam());
  auto backend = apply_offload(
      model, {}, component_config({"visual", "audio_tower"}, ComponentPolicy::kAlternating),
      engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(model.generate(4, engine->compute_device()), reference_tokens_prefix(4));
  const auto s = backend->stats();
  const size_t visual = unit_bytes(s, "visual"), audio = unit_bytes(s, "audio_tower");
  ASSERT_GT(visual - audio, audio / 8);
  EXPECT_EQ(s.loads, 4u);
  EXPECT_EQ(s.buffer_reuses, 0u);
  EXPECT_EQ(s.peak_device_bytes, s.resident_bytes + visual);
  EXPECT_EQ(s.current_device_bytes, s.resident_bytes + visual);
}

INSTANTIATE_TEST_SUITE_P(Devices, ComponentOffload,
                         ::testing::ValuesIn(omni::testing::all_devices()),
                         omni::testing::device_name);

TEST(ComponentOffloadConfig, ClearErrors) {
  TinyOmni model;
  auto engine = make_cpu_sim_engine({});
  try {
    apply_offload(model, {}, component_config({"vision"}, ComponentPolicy::kAlternating), engine);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component pattern 'vision' matches no module "
                                         "(top-level modules: audio_tower, visual, "
                                         "language_model)"),
              std::string::npos)
        << e.what();
  }
  TinyOmni model2;
  EXPECT_THROW(
      apply_offload(model2, {}, component_config({}, ComponentPolicy::kAlternating), engine),
      Error);
  TinyOmni model3;
  EXPECT_THROW(
      apply_offload(model3, {}, component_config({"visual"}, ComponentPolicy::kAlternating, 1000),
                    engine),
      Error);
  auto fraction = component_config({"visual"}, ComponentPolicy::kAlternating);
  fraction.device_budget_fraction = 0.5;
  TinyOmni model4;
  EXPECT_THROW(apply_offload(model4, {}, fraction, engine), Error);  // size unknown
  EXPECT_THROW(parse_component_policy("lru"), Error);
}

TEST(ComponentOffloadConfig, BudgetAsAFractionOfTheDevice) {
  TransferEngineOptions options;
  options.sim_device_memory_bytes = 4u << 20;  // a 4 MiB "device"
  auto engine = make_cpu_sim_engine(options);
  auto config = component_config({"visual", "audio_tower"}, ComponentPolicy::kAlternating);
  config.device_budget_fraction = 0.5;
  TinyOmni model;
  auto backend = apply_offload(model, {}, config, engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  EXPECT_EQ(model.generate(32, engine->compute_device()), reference_tokens());
  const auto s = backend->stats();
  EXPECT_LE(s.peak_device_bytes, 2u << 20);
  EXPECT_EQ(s.loads, 2u);  // both fit in 2 MiB: nothing evicted
}

// The host peak is the engine's host allocations at their highest: with every part offloaded,
// exactly the slabs; with the decoder resident, its staging buffer (two halves of up to
// staging_bytes / 2, freed before the slabs are packed) when that is larger. The allocator
// figures of the simulated device are its own buffers: no cache, so reserved = allocated.
TEST(ComponentOffloadStats, HostPeakIsTheSlabsAndAllocatorPeaksAreTheDevicePeak) {
  TransferEngineOptions options;
  options.sim_device_memory_bytes = 4u << 20;
  {
    SCOPED_TRACE("everything offloaded");
    auto engine = make_cpu_sim_engine(options);
    TinyOmni model;
    auto backend = apply_offload(model, {},
                                 component_config({"visual", "audio_tower", "language_model"},
                                                  ComponentPolicy::kAlternating),
                                 engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    EXPECT_EQ(model.generate(4, engine->compute_device()), reference_tokens_prefix(4));
    const auto s = backend->stats();
    const size_t slabs =
        unit_bytes(s, "visual") + unit_bytes(s, "audio_tower") + unit_bytes(s, "language_model");
    EXPECT_EQ(s.resident_bytes, 0u);
    EXPECT_EQ(s.host_bytes, slabs);
    EXPECT_EQ(s.host_peak_bytes, slabs);
    EXPECT_EQ(s.allocator_allocated_peak_bytes, s.peak_device_bytes);
    EXPECT_EQ(s.allocator_reserved_peak_bytes, s.peak_device_bytes);
    const DeviceMemoryInfo device = engine->device_memory();
    EXPECT_EQ(device.total, 4u << 20);
    EXPECT_EQ(device.allocator_allocated, s.current_device_bytes);
    EXPECT_EQ(device.allocator_reserved, s.current_device_bytes);
    EXPECT_EQ(device.free, (4u << 20) - s.current_device_bytes);
    EXPECT_EQ(device.available(), device.free);
    const std::string json = s.to_json();
    for (const std::string key : {"host_peak_bytes", "allocator_reserved_peak_bytes",
                                  "allocator_allocated_peak_bytes", "buffer_reuses"}) {
      EXPECT_NE(json.find("\"" + key + "\": "), std::string::npos) << key << " in " << json;
    }
    EXPECT_NE(json.find("\"host_peak_bytes\": " + std::to_string(slabs)), std::string::npos);
  }
  for (size_t staging : {size_t{64} << 20, size_t{4096}}) {
    SCOPED_TRACE(staging);
    auto engine = make_cpu_sim_engine(options);
    auto config = component_config({"visual", "audio_tower"}, ComponentPolicy::kAlternating);
    config.staging_bytes = staging;
    TinyOmni model;
    auto backend = apply_offload(model, {}, config, engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    EXPECT_EQ(model.generate(4, engine->compute_device()), reference_tokens_prefix(4));
    auto s = backend->stats();
    const size_t slabs = unit_bytes(s, "visual") + unit_bytes(s, "audio_tower");
    const size_t half = align_up(std::min(staging / 2, s.resident_bytes), kTensorAlignment);
    EXPECT_EQ(s.host_bytes, slabs);
    EXPECT_EQ(s.host_peak_bytes, std::max(slabs, 2 * half));
    if (staging == 4096) {
      EXPECT_EQ(s.host_peak_bytes, slabs);
    }
    EXPECT_EQ(s.allocator_allocated_peak_bytes, s.peak_device_bytes);
    EXPECT_EQ(s.allocator_reserved_peak_bytes, s.peak_device_bytes);
    // A new measurement starts from what is held now.
    backend->reset_stats();
    s = backend->stats();
    EXPECT_EQ(s.host_peak_bytes, slabs);
    EXPECT_EQ(s.allocator_allocated_peak_bytes, s.current_device_bytes);
  }
}

}  // namespace
}  // namespace omni::offload
