// The device expert cache (expert_cache.h) on a toy MoE: LRU order, the byte budget held
// exactly (engine memory counter peak), outputs bitwise equal to resident weights, prefetch,
// host compute on a miss, the plan's carve-out of experts; in strict mode (CUDA's ordering
// rules, strict_sim_default.cc) so that every ordering mistake aborts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "cpu_offload/expert_cache.h"
#include "cpu_offload/offload_plan.h"

namespace omni::offload {
namespace {

constexpr int64_t kHidden = 16;
constexpr int64_t kInter = 24;
constexpr size_t kExtra = 17;  // budget bytes beyond whole experts: not used

class Expert : public torch::nn::Module {
 public:
  Expert() {
    up = register_parameter("up", at::randn({kInter, kHidden}), false);
    down = register_parameter("down", at::randn({kHidden, kInter}), false);
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(at::relu(at::linear(x, up)), down); }
  at::Tensor up, down;
};

// layers.{l}.attn (a weight) and layers.{l}.mlp.experts.{e}.
class ToyMoe : public torch::nn::Module {
 public:
  ToyMoe(int layers, int experts_per_layer) {
    auto holder = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int l = 0; l < layers; ++l) {
      auto layer =
          holder->register_module(std::to_string(l), std::make_shared<torch::nn::Module>());
      attn.push_back(layer->register_parameter("attn", at::randn({kHidden, kHidden}), false));
      auto mlp = layer->register_module("mlp", std::make_shared<torch::nn::Module>());
      auto ex = mlp->register_module("experts", std::make_shared<torch::nn::Module>());
      experts.emplace_back();
      for (int e = 0; e < experts_per_layer; ++e) {
        experts.back().push_back(
            ex->register_module(std::to_string(e), std::make_shared<Expert>()));
      }
    }
  }
  static std::string path(int l, int e) {
    return "layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e);
  }
  std::vector<at::Tensor> attn;
  std::vector<std::vector<std::shared_ptr<Expert>>> experts;
};

OffloadConfig expert_config(size_t budget) {
  OffloadConfig config;
  config.expert_modules = {"layers.*.mlp.experts.*"};
  config.expert_cache_budget_bytes = budget;
  return config;
}

struct Setup {
  std::shared_ptr<TransferEngine> engine;
  std::unique_ptr<ToyMoe> model;
  OffloadPlan plan;
  std::unique_ptr<ExpertCache> cache;
  size_t expert_bytes = 0;
  std::unique_ptr<TransferEngine::ComputeScope> scope;
};

// An engine that copies like `inner` but times nothing: the CUDA engine without
// OMNI_CUDA_TIMING, whose counters count bytes and copies but no copy time.
class UntimedEngine : public TransferEngine {
 public:
  explicit UntimedEngine(std::shared_ptr<TransferEngine> inner) : inner_(std::move(inner)) {
    memory_ = inner_->memory_counter();
    host_ = inner_->host_counter();
  }
  DeviceKind kind() const override { return inner_->kind(); }
  c10::Device compute_device() const override { return inner_->compute_device(); }
  std::string describe() const override { return "untimed " + inner_->describe(); }
  HostBuffer allocate_host(size_t bytes, bool pin) override {
    return inner_->allocate_host(bytes, pin);
  }
  DeviceBuffer allocate_device(size_t bytes) override { return inner_->allocate_device(bytes); }
  Event copy_async(const std::vector<CopyOp>& ops, const std::vector<Event>& after,
                   TimeAccumulator*) override {
    uint64_t bytes = 0;
    for (const auto& op : ops) bytes += op.bytes;
    count_copy(bytes, 0);
    return inner_->copy_async(ops, after);
  }
  void compute_wait(const Event& event, TimeAccumulator*) override { inner_->compute_wait(event); }
  Event record_compute() override { return inner_->record_compute(); }
  std::unique_ptr<ComputeScope> enter_compute() override { return inner_->enter_compute(); }
  int64_t begin_compute_timing() override { return -1; }
  void end_compute_timing(int64_t, TimeAccumulator*) override {}
  void synchronize() override { inner_->synchronize(); }
  void release_finished_copies() override { inner_->release_finished_copies(); }
  void collect_timings() override { inner_->synchronize(); }
  DeviceMemoryInfo device_memory() override { return inner_->device_memory(); }

 private:
  std::shared_ptr<TransferEngine> inner_;
};

// Experts of a 1-layer toy in a cache of `slots` experts (+ `extra` bytes of budget).
Setup make(DeviceKind kind, int experts, size_t slots, size_t extra = 0,
           ExpertMissPolicy policy = ExpertMissPolicy::kFetch, int layers = 1, bool untimed = false,
           ExpertEviction eviction = ExpertEviction::kLayer, double prefetch_min_precision = 0.5) {
  Setup s;
  s.engine = make_transfer_engine(kind);
  if (untimed) s.engine = std::make_shared<UntimedEngine>(s.engine);
  s.model = std::make_unique<ToyMoe>(layers, experts);
  auto config = expert_config(1);
  s.plan = make_offload_plan(*s.model, {}, config);
  s.expert_bytes = s.plan.experts.front().bytes;  // tensor bytes; slab adds padding
  // Slab bytes: up and down each at a 256-byte boundary.
  const size_t slab = align_up(kInter * kHidden * 4, kTensorAlignment) * 2;
  s.expert_bytes = slab;
  config.expert_cache_budget_bytes = slots * slab + extra;
  config.expert_miss_policy = policy;
  config.expert_eviction = eviction;
  config.expert_prefetch_min_precision = prefetch_min_precision;
  s.cache = make_expert_cache(*s.model, s.plan, config, s.engine);
  s.scope = s.engine->enter_compute();  // the tests' forwards
  return s;
}

std::vector<int> keys(const Setup& s, const std::vector<int>& experts) {
  std::vector<int> out;
  for (int e : experts) out.push_back(s.cache->key_of(ToyMoe::path(0, e)));
  return out;
}

class ExpertCacheTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(ExpertCacheTest, PlanCarvesExpertsOutOfResidentAndLayerwiseUnits) {
  ToyMoe model(2, 4);
  auto config = expert_config(1 << 20);
  auto plan = make_offload_plan(model, {}, config);
  ASSERT_EQ(plan.experts.size(), 8u);
  EXPECT_EQ(plan.experts[5].name, "layers.1.mlp.experts.1");
  EXPECT_EQ(plan.experts[5].tensor_names,
            (std::vector<std::string>{"layers.1.mlp.experts.1.up", "layers.1.mlp.experts.1.down"}));
  EXPECT_EQ(plan.resident_tensors, (std::vector<std::string>{"layers.0.attn", "layers.1.attn"}));
  EXPECT_EQ(plan.expert_bytes, 8u * 2 * kHidden * kInter * 4);

  config.layerwise = true;
  ModelSpec spec;
  spec.dits = {"layers"};
  spec.block_lists = {{"layers", {}}};
  plan = make_offload_plan(model, spec, config);
  ASSERT_EQ(plan.units.size(), 2u);
  EXPECT_EQ(plan.units[1].tensor_names, (std::vector<std::string>{"layers.1.attn"}));
  EXPECT_EQ(plan.experts.size(), 8u);
  EXPECT_TRUE(plan.resident_tensors.empty());

  config.resident_modules = {"layers.1"};  // kept resident, experts still carved out
  plan = make_offload_plan(model, spec, config);
  EXPECT_EQ(plan.resident_tensors, (std::vector<std::string>{"layers.1.attn"}));
  EXPECT_EQ(plan.experts.size(), 8u);

  config.expert_modules = {"layers.*.nothing.*"};
  EXPECT_THROW(make_offload_plan(model, spec, config), Error);
}

TEST_P(ExpertCacheTest, LeastRecentlyUsedLeavesFirst) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  // One layer: the layer policy's order is LRU's (every expert a request passes over is stale).
  for (auto eviction : {ExpertEviction::kLru, ExpertEviction::kLayer}) {
    SCOPED_TRACE(to_string(eviction));
    auto s = make(GetParam(), 4, 2, 0, ExpertMissPolicy::kFetch, 1, false, eviction);
    ASSERT_EQ(s.cache->slots(), 2u);
    auto& cache = *s.cache;
    cache.ensure(keys(s, {0}));
    cache.ensure(keys(s, {1}));
    cache.ensure(keys(s, {0}));  // hit: 0 becomes the most recent
    cache.ensure(keys(s, {2}));  // evicts 1, the least recently used
    EXPECT_TRUE(cache.unit(keys(s, {0})[0]).bound());
    EXPECT_FALSE(cache.unit(keys(s, {1})[0]).bound());
    EXPECT_TRUE(cache.unit(keys(s, {2})[0]).bound());
    cache.ensure(keys(s, {0}));  // hit
    cache.ensure(keys(s, {1}));  // miss: evicts 2
    EXPECT_FALSE(cache.unit(keys(s, {2})[0]).bound());
    const auto st = cache.stats();
    EXPECT_EQ(st.requests, 6u);
    EXPECT_EQ(st.hits, 2u);
    EXPECT_EQ(st.misses, 4u);
    EXPECT_EQ(st.evictions, 2u);
    EXPECT_EQ(st.loads, 4u);
    EXPECT_EQ(st.bytes_h2d, 4 * s.expert_bytes);
    // A request never evicts its own experts.
    cache.ensure(keys(s, {2, 3}));
    EXPECT_TRUE(cache.unit(keys(s, {2})[0]).bound());
    EXPECT_TRUE(cache.unit(keys(s, {3})[0]).bound());
    EXPECT_THROW(cache.ensure(keys(s, {0, 1, 2})), Error);  // more than the slots
  }
}

// A decoder asks for its layers' experts in the same order every token. With more experts per
// token than slots, LRU evicts exactly the expert needed next and never hits; the layer policy
// evicts the one whose layer runs last from now, which is Belady's optimal choice here: for 6
// tokens of 4 layers through 3 slots, 10 misses and 14 hits (an offline simulation of Belady's
// algorithm on the same sequence gives the same).
TEST_P(ExpertCacheTest, LayerEvictionHitsWhereLruThrashesOnACycleLargerThanTheCache) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const int layers = 4, tokens = 6;
  for (auto eviction : {ExpertEviction::kLru, ExpertEviction::kLayer}) {
    SCOPED_TRACE(to_string(eviction));
    auto s = make(GetParam(), 2, 3, 0, ExpertMissPolicy::kFetch, layers, false, eviction);
    auto& cache = *s.cache;
    ASSERT_EQ(cache.layers(), layers);
    EXPECT_EQ(cache.layer_of(cache.key_of(ToyMoe::path(2, 1))), 2);
    for (int t = 0; t < tokens; ++t) {
      for (int l = 0; l < layers; ++l) cache.ensure({cache.key_of(ToyMoe::path(l, 0))});
    }
    const auto st = cache.stats();
    EXPECT_EQ(st.uses(), static_cast<uint64_t>(layers * tokens));
    if (eviction == ExpertEviction::kLru) {
      EXPECT_EQ(st.hits, 0u);
    } else {
      EXPECT_EQ(st.misses, 10u);
      EXPECT_EQ(st.hits, 14u);
    }
  }
}

// Experts their layer passed over (stale) leave first, even when LRU would keep them.
TEST_P(ExpertCacheTest, LayerEvictionDropsExpertsTheirLayerPassedOverFirst) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (auto eviction : {ExpertEviction::kLru, ExpertEviction::kLayer}) {
    SCOPED_TRACE(to_string(eviction));
    auto s = make(GetParam(), 2, 3, 0, ExpertMissPolicy::kFetch, 3, false, eviction);
    auto& cache = *s.cache;
    auto key = [&](int l, int e) { return cache.key_of(ToyMoe::path(l, e)); };
    cache.ensure({key(2, 0)});  // layer 2 has not run since: (2,0) may be needed
    cache.ensure({key(0, 0)});
    cache.ensure({key(0, 1)});  // layer 0 passes over (0,0): stale, though newer than (2,0)
    cache.ensure({key(1, 0)});  // a miss with the three slots full
    const bool layer = eviction == ExpertEviction::kLayer;
    EXPECT_EQ(cache.unit(key(2, 0)).bound(), layer);
    EXPECT_EQ(cache.unit(key(0, 0)).bound(), !layer);
    EXPECT_TRUE(cache.unit(key(0, 1)).bound());
    EXPECT_TRUE(cache.unit(key(1, 0)).bound());
  }
}

TEST_P(ExpertCacheTest, BudgetHeldExactlyAndOutputsEqualResident) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const int experts = 8;
  for (size_t slots : {1u, 3u, 8u}) {
    at::manual_seed(7);
    ToyMoe reference(1, experts);
    at::manual_seed(7);
    auto s = make(GetParam(), experts, slots, /*extra=*/kExtra);
    const size_t budget = slots * s.expert_bytes + kExtra;
    EXPECT_EQ(s.cache->slots(), slots);
    EXPECT_EQ(s.cache->stats().device_bytes, slots * s.expert_bytes);
    s.engine->reset_counters();
    // The reference computes where the cache does: a GPU's kernels differ from the host's in
    // the last bits, and the property is that streamed weights change nothing.
    reference.to(s.engine->compute_device());
    const auto x = at::randn({3, kHidden});
    const auto xd = x.to(s.engine->compute_device());
    at::manual_seed(11);
    for (int step = 0; step < 40; ++step) {
      const int n = static_cast<int>(std::min<size_t>(slots, 1 + step % 3));
      auto perm = at::randperm(experts, at::kLong);
      std::vector<int> chosen;
      for (int i = 0; i < n; ++i) chosen.push_back(static_cast<int>(perm[i].item<int64_t>()));
      s.cache->ensure(keys(s, chosen));
      for (int e : chosen) {
        const auto want = reference.experts[0][e]->forward(xd).cpu();
        const auto got = s.model->experts[0][e]->forward(xd).cpu();
        ASSERT_TRUE(at::equal(got, want)) << "expert " << e << " step " << step;
      }
      if (step % 5 == 0) s.cache->prefetch(keys(s, {(step / 5) % experts}));
    }
    EXPECT_LE(s.engine->memory_counter()->peak(), budget);
    EXPECT_EQ(s.engine->memory_counter()->peak(), slots * s.expert_bytes);
    const auto st = s.cache->stats();
    EXPECT_EQ(st.bytes_h2d, st.loads * s.expert_bytes);
    EXPECT_EQ(st.loads, st.misses + st.prefetched);
  }
}

TEST_P(ExpertCacheTest, PrefetchedExpertsAreHitsAndSpareTheCurrentRequest) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto s = make(GetParam(), 6, 3);
  auto& cache = *s.cache;
  cache.ensure(keys(s, {0, 1}));
  // One slot is free; the current request's experts are not victims.
  EXPECT_EQ(cache.prefetch(keys(s, {2, 3, 4})), 1u);
  EXPECT_TRUE(cache.unit(keys(s, {0})[0]).bound());
  EXPECT_TRUE(cache.unit(keys(s, {1})[0]).bound());
  EXPECT_FALSE(cache.unit(keys(s, {2})[0]).bound());  // arriving, bound at use
  cache.ensure(keys(s, {2}));
  auto st = cache.stats();
  EXPECT_EQ(st.prefetched, 1u);
  EXPECT_EQ(st.prefetch_hits, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_DOUBLE_EQ(st.prefetch_hit_rate(), 1.0);
  // Now {0, 1} are no longer protected: a prefetch may take their slots (LRU first).
  EXPECT_EQ(cache.prefetch(keys(s, {3, 4})), 2u);
  EXPECT_TRUE(cache.unit(keys(s, {2})[0]).bound());  // the current request
  cache.ensure(keys(s, {4, 3}));
  st = cache.stats();
  EXPECT_EQ(st.prefetch_hits, 3u);
  EXPECT_EQ(st.misses, 2u);
  cache.reset_stats();
  EXPECT_EQ(cache.stats().uses(), 0u);
  EXPECT_EQ(cache.stats().slots, 3u);
}

// The prefetch gate: 128 predictions that miss (each copies an expert its layer then does not
// ask for) close it, so that prefetch_wanted() says yes to one call in eight only; 128 that hit
// open it again. With a minimum of 0 it never closes. Two layers, two slots: layer 0's expert
// stays, layer 1's cycle through the other slot, so that every prediction is copied (scored).
TEST_P(ExpertCacheTest, PrefetchStopsWhileItsPredictionsMissAndResumesWhenTheyHit) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (double min_precision : {0.5, 0.0}) {
    SCOPED_TRACE(min_precision);
    auto s = make(GetParam(), 4, 2, 0, ExpertMissPolicy::kFetch, 2, false, ExpertEviction::kLayer,
                  min_precision);
    auto& cache = *s.cache;
    auto key = [&](int l, int e) { return cache.key_of(ToyMoe::path(l, e)); };
    const size_t window = cache.options().prefetch_window;
    ASSERT_EQ(window, 128u);
    for (size_t i = 0; i < window; ++i) {  // wrong: layer 1 asks for expert 0
      cache.ensure({key(0, 0)});
      ASSERT_TRUE(cache.prefetch_wanted()) << "closed before a window was scored, at " << i;
      ASSERT_EQ(cache.prefetch({key(1, 2 + static_cast<int>(i % 2))}), 1u);
      cache.ensure({key(1, 0)});
    }
    cache.ensure({key(0, 0)});  // scores the last prediction: the window is full
    int yes = 0;
    for (int i = 0; i < 16; ++i) yes += cache.prefetch_wanted() ? 1 : 0;
    auto st = cache.stats();
    EXPECT_EQ(st.prefetch_scored, window);
    EXPECT_EQ(st.prefetch_scored_used, 0u);
    if (min_precision > 0) {
      EXPECT_EQ(yes, 2);  // the probes
      EXPECT_EQ(st.prefetch_skipped, 14u);
    } else {
      EXPECT_EQ(yes, 16);
      EXPECT_EQ(st.prefetch_skipped, 0u);
    }
    // Right: layer 1 asks for the predicted expert. Experts 2 and 3 alternate, so the one
    // predicted is never the one layer 1 left on the device. While the gate is closed the
    // predictions are only scored: nothing is copied.
    const bool closed = min_precision > 0;
    for (size_t i = 0; i < window; ++i) {
      const int e = 2 + static_cast<int>(i % 2);
      ASSERT_EQ(cache.prefetch({key(1, e)}), closed ? 0u : 1u) << i;
      cache.ensure({key(1, e)});
      cache.ensure({key(0, 0)});
    }
    st = cache.stats();
    EXPECT_EQ(st.prefetched, closed ? window : 2 * window);
    EXPECT_EQ(st.prefetch_hits, closed ? 0u : window);
    yes = 0;
    for (int i = 0; i < 16; ++i) yes += cache.prefetch_wanted() ? 1 : 0;
    EXPECT_EQ(yes, 16);
    EXPECT_EQ(st.prefetch_scored, 2 * window);
    EXPECT_EQ(st.prefetch_scored_used, window);
    EXPECT_DOUBLE_EQ(st.prefetch_precision(), 0.5);
    // Open again: a prediction is copied.
    EXPECT_EQ(cache.prefetch({key(1, 2)}), 1u);
  }
}

// A model asks the gate before a layer's ensure() (its prediction is taken before it waits for
// the layer's misses): a prediction of another layer still pending is then over, and is scored
// first, as that ensure() would score it. Without that, the window that the last layer's
// prediction completes would close the gate only one call later.
TEST_P(ExpertCacheTest, TheGateAskedBeforeALayerScoresWhatTheLayerBeforeItUsed) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto s =
      make(GetParam(), 4, 2, 0, ExpertMissPolicy::kFetch, 2, false, ExpertEviction::kLayer, 0.5);
  auto& cache = *s.cache;
  auto key = [&](int l, int e) { return cache.key_of(ToyMoe::path(l, e)); };
  const size_t window = cache.options().prefetch_window;
  for (size_t i = 0; i < window; ++i) {  // wrong: layer 1 asks for expert 0
    ASSERT_TRUE(cache.prefetch_wanted(key(0, 0))) << "closed before a window was scored, at " << i;
    cache.ensure({key(0, 0)});
    ASSERT_EQ(cache.prefetch({key(1, 2 + static_cast<int>(i % 2))}), 1u);
    cache.ensure({key(1, 0)});
  }
  int yes = 0;
  for (int i = 0; i < 16; ++i) yes += cache.prefetch_wanted(key(0, 0)) ? 1 : 0;
  EXPECT_EQ(yes, 2);  // closed at the first call: the probes only
  EXPECT_EQ(cache.stats().prefetch_scored, window);
  cache.ensure({key(0, 0)});  // nothing left to score
  EXPECT_EQ(cache.stats().prefetch_scored, window);
  // A prediction of the layer about to run is not over yet: it is not scored.
  cache.prefetch({key(1, 2)});
  cache.prefetch_wanted(key(1, 0));
  EXPECT_EQ(cache.stats().prefetch_scored, window);
}

TEST_P(ExpertCacheTest, HostMissPolicyComputesFromTheHostSlab) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  at::manual_seed(3);
  ToyMoe reference(1, 4);
  at::manual_seed(3);
  auto s = make(GetParam(), 4, 1, 0, ExpertMissPolicy::kHost);
  // Nothing is ever copied under the host policy: the budget's slot is not allocated.
  EXPECT_EQ(s.cache->slots(), 0u);
  EXPECT_EQ(s.engine->memory_counter()->peak(), 0u);
  const auto x = at::randn({2, kHidden});
  for (int round = 0; round < 2; ++round) {
    const auto placement = s.cache->ensure(keys(s, {1, 3}));
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(placement[i], ExpertCache::Placement::kHost);
      const int e = i ? 3 : 1;
      EXPECT_TRUE(
          at::equal(s.model->experts[0][e]->forward(x), reference.experts[0][e]->forward(x)));
    }
  }
  const auto st = s.cache->stats();
  EXPECT_EQ(st.host_computed, 4u);
  EXPECT_EQ(st.loads, 0u);
  EXPECT_EQ(st.bytes_h2d, 0u);
  EXPECT_EQ(st.device_bytes, 0u);
  EXPECT_EQ(s.cache->prefetch(keys(s, {0, 2})), 0u);
  EXPECT_EQ(s.engine->memory_counter()->peak(), 0u);
}

// The auto policy needs the link's speed. An engine that times no copies (CUDA without
// OMNI_CUDA_TIMING) reports none: the cache then times its first fetch itself, on the host,
// instead of fetching every miss forever.
TEST_P(ExpertCacheTest, AutoMissPolicyMeasuresTheLinkWhenTheEngineDoesNotTimeCopies) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  for (bool untimed : {false, true}) {
    SCOPED_TRACE(untimed ? "untimed engine" : "timed engine");
    at::manual_seed(5);
    ToyMoe reference(1, 6);
    at::manual_seed(5);
    auto s = make(GetParam(), 6, 4, 0, ExpertMissPolicy::kAuto, 1, untimed);
    EXPECT_EQ(s.engine->counters().copy_ms, 0.0);
    const auto x = at::randn({2, kHidden});
    const auto xd = x.to(s.engine->compute_device());
    // Nothing measured yet: the first misses are fetched (and the link timed).
    auto placement = s.cache->ensure(keys(s, {0, 1}));
    EXPECT_EQ(placement[0], ExpertCache::Placement::kDevice);
    EXPECT_EQ(placement[1], ExpertCache::Placement::kDevice);
    // The link is known, the host rate not yet: the next miss runs on the host to measure it.
    placement = s.cache->ensure(keys(s, {2}));
    EXPECT_EQ(placement[0], ExpertCache::Placement::kHost);
    const auto got = s.model->experts[0][2]->forward(x);
    EXPECT_TRUE(at::equal(got, reference.experts[0][2]->forward(x)));
    s.cache->ensure(keys(s, {0}));             // a hit stays on the device
    reference.to(s.engine->compute_device());  // device results against device results
    EXPECT_TRUE(at::equal(s.model->experts[0][0]->forward(xd).cpu(),
                          reference.experts[0][0]->forward(xd).cpu()));
    const auto st = s.cache->stats();
    EXPECT_EQ(st.host_computed, 1u);
    EXPECT_EQ(st.loads, 2u);
    EXPECT_EQ(st.hits, 1u);
  }
}

TEST_P(ExpertCacheTest, BudgetBelowOneExpertIsAClearError) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  try {
    make(GetParam(), 4, 0, 100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("expert_cache_budget (100 bytes) is smaller than one expert"),
        std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ExpertCacheTest, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_name);

}  // namespace
}  // namespace omni::offload
