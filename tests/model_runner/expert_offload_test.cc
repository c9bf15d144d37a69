// Expert-level MoE offload of the Qwen3-Omni thinker (cpu_offload_experts): the experts go to a
// device expert cache, the rest follows the strategy (resident or layerwise). Greedy tokens must
// equal the resident run's for every budget (one expert: fewer slots than top-k, so a layer runs
// in chunks; 2 experts; 50%; 100%), with and without next-layer prefetch, with host compute on a
// miss; the simulated device runs in strict mode (CUDA's ordering rules) throughout.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/expert_offload.h"
#include "model_runner/runner/thinker_runner.h"

namespace omni::models {
namespace {

// Before any engine is made: strict mode unless the environment says otherwise.
[[maybe_unused]] const int kStrict = setenv("OMNI_SIM_STRICT", "1", /*overwrite=*/0);

using offload::DeviceKind;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
constexpr int64_t kTokens = 24;

ChatRequest request() {
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

const std::vector<int64_t>& baseline(DeviceKind kind) {
  static std::map<DeviceKind, std::vector<int64_t>> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  auto runner = load(kind);
  return cache.emplace(kind, runner->generate(runner->prepare(request()), greedy()).tokens)
      .first->second;
}

// run_expert calls of every MoE layer: one per hit expert per forward.
int64_t expert_calls(ThinkerRunner& runner) {
  int64_t calls = 0;
  for (const auto& m : runner.model().modules()) {
    if (auto* moe = dynamic_cast<qwen3_omni::SparseMoe*>(m.get()))
      calls += moe->stats().expert_calls;
  }
  return calls;
}

struct Case {
  std::string name;
  std::string budget;  // as the CLI takes it
  bool prefetch = true;
  bool layerwise = false;
  std::string miss_policy = "fetch";
  std::string eviction = "layer";
};

ThinkerOffloadOptions options_for(const Case& c) {
  ThinkerOffloadOptions o;
  o.cpu_offload_experts = true;
  parse_expert_cache_budget(c.budget, "expert_cache_budget", &o.expert_cache_budget_bytes,
                            &o.expert_cache_budget_fraction);
  o.expert_prefetch = c.prefetch;
  o.expert_miss_policy = c.miss_policy;
  o.expert_eviction = c.eviction;
  if (c.layerwise) {
    o.layerwise = true;
    o.layerwise_encoders = false;
  }
  return o;
}

class ExpertOffload : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(ExpertOffload, TokensEqualResidentForEveryBudgetPrefetchAndStrategy) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  const auto& want = baseline(GetParam());
  ASSERT_EQ(want.size(), static_cast<size_t>(kTokens));
  // The tiny fixture: 2 MoE layers (layer 1 is dense) x 8 experts, top-2; one expert is 3
  // matrices of 64 x 32 fp32 = 24576 bytes.
  const size_t expert = 3 * 64 * 32 * 4;
  const std::vector<Case> cases = {
      {"one expert (fewer slots than top-k)", std::to_string(expert), true},
      {"one expert, no prefetch", std::to_string(expert), false},
      {"two experts", std::to_string(2 * expert), true},
      {"50%", "50%", true},
      {"50% no prefetch", "50%", false},
      {"100%", "100%", true},
      {"two experts, layerwise rest", std::to_string(2 * expert), true, true},
      {"50%, layerwise rest, no prefetch", "50%", false, true},
      {"host miss policy, one expert", std::to_string(expert), true, false, "host"},
      {"host miss policy, layerwise rest", "25%", false, true, "host"},
      {"auto miss policy", "25%", true, false, "auto"},
      {"lru eviction, two experts", std::to_string(2 * expert), true, false, "fetch", "lru"},
      {"lru eviction, 50%, no prefetch", "50%", false, false, "fetch", "lru"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto runner = load(GetParam(), options_for(c));
    ASSERT_NE(runner->expert_cache(), nullptr);
    auto& cache = *runner->expert_cache();
    EXPECT_EQ(cache.size(), 16u);
    EXPECT_EQ(cache.expert_bytes(), expert);
    EXPECT_EQ(runner->generate(runner->prepare(request()), greedy()).tokens, want);
    const auto s = cache.stats();
    // Every expert a forward ran was asked for once: hits + misses = uses.
    EXPECT_EQ(static_cast<int64_t>(s.uses()), expert_calls(*runner));
    EXPECT_EQ(s.loads, s.misses - s.host_computed + s.prefetched);
    EXPECT_EQ(s.bytes_h2d, s.loads * expert);
    EXPECT_LE(s.prefetch_hits, s.prefetched);
    EXPECT_LE(s.device_bytes, s.budget_bytes);
    if (!c.prefetch) {
      EXPECT_EQ(s.prefetched, 0u);
    }
    if (c.miss_policy == "host") {
      EXPECT_EQ(s.host_computed, s.misses);
      EXPECT_EQ(s.bytes_h2d, 0u);
    } else if (c.miss_policy == "fetch") {
      EXPECT_EQ(s.host_computed, 0u);
    }
    if (c.budget == "100%") {
      // Every expert fits: each misses (or is prefetched) once at most.
      EXPECT_LE(s.loads, 16u);
    }
    // The experts' device bytes are the cache's slots, not all experts.
    const auto os = runner->offload().stats();
    EXPECT_LE(os.peak_device_bytes,
              os.resident_bytes + s.device_bytes + (c.layerwise ? 2 * os.max_unit_bytes : 0));
    EXPECT_EQ(runner->offload().plan().experts.size(), 16u);
  }
}

TEST_P(ExpertOffload, PrefetchFromTheNextRouterHitsAndSavesMisses) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  // Room for every expert: a prefetch never evicts anything useful, so each prefetch hit is a
  // miss saved. (With little room a wrong prediction evicts experts that would have been hits:
  // on this random-weight fixture the router of layer 2 on layer 0's input predicts poorly;
  // thinker-bench measures the real-shape preset.)
  auto a = load(GetParam(), options_for({"prefetch", "100%", true}));
  auto b = load(GetParam(), options_for({"no prefetch", "100%", false}));
  EXPECT_EQ(a->generate(a->prepare(request()), greedy()).tokens, baseline(GetParam()));
  EXPECT_EQ(b->generate(b->prepare(request()), greedy()).tokens, baseline(GetParam()));
  const auto sa = a->expert_cache()->stats(), sb = b->expert_cache()->stats();
  EXPECT_GT(sa.prefetched, 0u);
  EXPECT_GT(sa.prefetch_hits, 0u);
  EXPECT_EQ(sa.uses(), sb.uses());
  EXPECT_EQ(sa.misses + sa.prefetch_hits, sb.misses);
  // Every used expert loads once either way; prefetches never used are the only extra copies.
  EXPECT_EQ(sa.loads, sb.loads + (sa.prefetched - sa.prefetch_hits));
  // With four slots the prefetches still land and are counted.
  auto c = load(GetParam(), options_for({"prefetch", std::to_string(4 * 3 * 64 * 32 * 4), true}));
  EXPECT_EQ(c->generate(c->prepare(request()), greedy()).tokens, baseline(GetParam()));
  const auto sc = c->expert_cache()->stats();
  EXPECT_GT(sc.prefetch_hits, 0u);
  EXPECT_EQ(sc.loads, sc.misses + sc.prefetched);
  c->expert_cache()->reset_stats();
  EXPECT_EQ(c->expert_cache()->stats().uses(), 0u);
}

TEST_P(ExpertOffload, BadOptionsAreClearErrors) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  ThinkerOffloadOptions o;
  o.cpu_offload_experts = true;
  o.expert_cache_budget_bytes = 1000;  // below one expert (24576 bytes)
  try {
    load(GetParam(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_cache_budget (1000 bytes) is smaller than one "
                                         "expert (24576 bytes"),
              std::string::npos)
        << e.what();
  }
  o.expert_cache_budget_bytes = 0;
  o.expert_miss_policy = "sometimes";
  EXPECT_THROW(load(GetParam(), o), Error);
  o.expert_miss_policy = "fetch";
  o.expert_eviction = "fifo";
  try {
    load(GetParam(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown expert_eviction 'fifo' (expected layer or lru)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ExpertCacheBudget, ParsesPercentagesAndBytes) {
  size_t bytes = 0;
  double fraction = 0;
  parse_expert_cache_budget("25%", "expert_cache_budget", &bytes, &fraction);
  EXPECT_EQ(bytes, 0u);
  EXPECT_DOUBLE_EQ(fraction, 0.25);
  parse_expert_cache_budget("768MiB", "expert_cache_budget", &bytes, &fraction);
  EXPECT_EQ(bytes, size_t{768} << 20);
  EXPECT_EQ(fraction, 0.0);
  parse_expert_cache_budget("1.5GiB", "x", &bytes, &fraction);
  EXPECT_EQ(bytes, size_t{3} << 29);
  parse_expert_cache_budget("4096", "x", &bytes, &fraction);
  EXPECT_EQ(bytes, 4096u);
  for (const char* bad : {"", "abc", "0%", "150%", "12 parsecs", "-5", "0", "2G"}) {
    try {
      parse_expert_cache_budget(bad, "--expert-cache-budget", &bytes, &fraction);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--expert-cache-budget"), std::string::npos);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ExpertOffload, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_name);

}  // namespace
}  // namespace omni::models
