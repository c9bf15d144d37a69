// The disk tier on the Qwen3-Omni thinker (host_memory_budget): under a host budget below the
// streamed weights, layers and experts are read from the checkpoint's safetensors file when
// needed. Greedy tokens must equal the resident run's, the host must hold no more than the
// budget, and the bytes must really come from the file. Strict simulated device throughout.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

[[maybe_unused]] const int kStrict = setenv("OMNI_SIM_STRICT", "1", /*overwrite=*/0);

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

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
  p.max_new_tokens = 16;
  return p;
}

struct Loaded {
  std::shared_ptr<offload::TransferEngine> engine;
  std::unique_ptr<ThinkerRunner> runner;
};

Loaded load(const ThinkerOffloadOptions& offload) {
  Loaded out;
  out.engine = offload::make_transfer_engine(offload::DeviceKind::kCpuSim);
  ThinkerRunnerOptions options;
  options.model_dir = kDir;
  options.offload = offload;
  out.runner = ThinkerRunner::load(options, out.engine);
  return out;
}

const std::vector<int64_t>& baseline() {
  static const std::vector<int64_t> tokens = [] {
    auto l = load({});
    return l.runner->generate(l.runner->prepare(request()), greedy()).tokens;
  }();
  return tokens;
}

// Slab bytes the planner counts for a unit: its tensors plus alignment padding for each.
size_t planned_bytes(const offload::UnitPlan& u) {
  return u.bytes + offload::kTensorAlignment * u.tensor_names.size();
}

ThinkerOffloadOptions layerwise() {
  ThinkerOffloadOptions o;
  o.layerwise = true;  // decoder layers, audio layers and vision blocks stream
  return o;
}

ThinkerOffloadOptions experts(bool with_layerwise) {
  ThinkerOffloadOptions o;
  o.cpu_offload_experts = true;
  o.expert_cache_budget_fraction = 0.25;
  if (with_layerwise) {
    o.layerwise = true;
    o.layerwise_encoders = false;
  }
  return o;
}

// The largest unit of the layerwise plan (the disk tier needs room for three).
size_t layerwise_max_unit() {
  // Held in a local: a range-for over a member of a temporary runs after the runner is freed.
  const Loaded loaded = load(layerwise());
  size_t max_unit = 0;
  for (const auto& u : loaded.runner->offload().plan().units) {
    max_unit = std::max(max_unit, planned_bytes(u));
  }
  return max_unit;
}

void expect_within_budget(const Loaded& l, size_t budget) {
  // Every host slab and disk-tier entry still held (the staging of resident weights is gone).
  EXPECT_LE(l.engine->host_counter()->current(), budget);
}

TEST(DiskTier, LayerwiseUnitsReadFromTheCheckpointGiveTheSameTokens) {
  // The budget: exactly the smallest cache the tier accepts (window 1 + 1 + read-ahead 1).
  const auto plan = load(layerwise()).runner->offload().plan();
  size_t max_unit = 0, total = 0;
  for (const auto& u : plan.units) {
    max_unit = std::max(max_unit, planned_bytes(u));
    total += planned_bytes(u);
  }
  const size_t budget = 3 * max_unit;
  ASSERT_LT(budget, total) << "the fixture's units fit a 3-unit cache: nothing would go to disk";
  auto o = layerwise();
  o.disk_read_ahead = 1;
  o.host_memory_budget_bytes = budget;
  auto l = load(o);
  EXPECT_EQ(l.runner->generate(l.runner->prepare(request()), greedy()).tokens, baseline());
  const auto disk = l.runner->offload().disk_stats();
  ASSERT_TRUE(disk.has_value());
  EXPECT_EQ(disk->entries, 3u);
  EXPECT_GT(disk->reads, 0u);
  EXPECT_GT(disk->read_aheads, 0u);
  EXPECT_GT(disk->read_ahead_used, 0u);
  // Nine units (3 decoder layers, 2 audio layers, 4 vision blocks) cycle through three
  // entries: they are read again.
  EXPECT_GT(disk->read_bytes, total);
  expect_within_budget(l, budget);

  o.host_memory_budget_bytes = 2 * max_unit;  // below the minimum: a clear error
  try {
    load(o);
    FAIL() << "a host budget below three units was accepted";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--host-memory-budget"), std::string::npos) << e.what();
  }

  // The reader threads reach the engine's config (thinker-bench --disk-reader-threads).
  o.host_memory_budget_bytes = budget;
  o.disk_reader_threads = 1;
  auto one_reader = load(o);
  EXPECT_EQ(one_reader.runner->generate(one_reader.runner->prepare(request()), greedy()).tokens,
            baseline());
  o.disk_reader_threads = 0;
  try {
    load(o);
    FAIL() << "0 reader threads were accepted";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("disk_reader_threads must be in [1, 64], got 0"),
              std::string::npos)
        << e.what();
  }
}

// A layer read that fails mid-forward (the checkpoint shrank) fails that request with the file
// named, and leaves the layerwise backend consistent: once the file is whole again, the next
// requests give the resident tokens (a unit left counted as running would pin its slot).
TEST(DiskTier, AFailedLayerReadFailsTheRequestAndTheNextOnesWork) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("omni_disk_fail_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f :
       {"config.json", "tokenizer.json", "preprocessor_config.json", "model.safetensors"}) {
    fs::copy_file(fs::path(kDir) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  const fs::path file = dir / "model.safetensors";
  const std::string content = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const size_t max_unit = layerwise_max_unit();
  auto o = layerwise();
  o.disk_read_ahead = 1;
  o.host_memory_budget_bytes = 3 * max_unit;
  Loaded l;
  l.engine = offload::make_transfer_engine(offload::DeviceKind::kCpuSim);
  ThinkerRunnerOptions options;
  options.model_dir = dir.string();
  options.offload = o;
  l.runner = ThinkerRunner::load(options, l.engine);
  const auto inputs = l.runner->prepare(request());
  // Only the units' bytes are read again after the load; the header and resident weights
  // (in the first bytes) are not, so keep those and cut the rest.
  fs::resize_file(file, 4096);
  try {
    l.runner->generate(inputs, greedy());
    ADD_FAILURE() << "a forward with its layers' bytes gone succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << content;
  EXPECT_EQ(l.runner->generate(inputs, greedy()).tokens, baseline());
  // And as a runner that never failed does it: every unit prefetched in order, none left
  // pinned to its slot (that would turn the loads after it into synchronous ones).
  l.runner->offload().reset_stats();
  EXPECT_EQ(l.runner->generate(inputs, greedy()).tokens, baseline());
  const auto after = l.runner->offload().stats();
  Loaded fresh;
  fresh.engine = offload::make_transfer_engine(offload::DeviceKind::kCpuSim);
  fresh.runner = ThinkerRunner::load(options, fresh.engine);
  fresh.runner->generate(inputs, greedy());
  fresh.runner->offload().reset_stats();
  fresh.runner->generate(inputs, greedy());
  const auto want = fresh.runner->offload().stats();
  EXPECT_EQ(after.sync_loads, want.sync_loads);
  EXPECT_EQ(after.loads, want.loads);
  EXPECT_EQ(after.current_device_bytes, want.current_device_bytes);
  fresh.runner.reset();
  l.runner.reset();
  fs::remove_all(dir);
}

TEST(DiskTier, ExpertsReadFromTheCheckpointGiveTheSameTokens) {
  for (const bool with_layerwise : {false, true}) {
    SCOPED_TRACE(with_layerwise ? "experts-layerwise" : "experts");
    const auto plan = load(experts(with_layerwise)).runner->offload().plan();
    size_t units = 0, expert = 0;
    for (const auto& u : plan.units) units += planned_bytes(u);
    for (const auto& e : plan.experts) expert = std::max(expert, planned_bytes(e));
    ASSERT_EQ(plan.experts.size(), 16u);  // 2 MoE layers x 8 experts
    // Room for the layer units and 5 experts: the experts go to disk, the layers stay.
    const size_t budget = units + 5 * expert;
    auto o = experts(with_layerwise);
    o.host_memory_budget_bytes = budget;
    auto l = load(o);
    EXPECT_EQ(l.runner->generate(l.runner->prepare(request()), greedy()).tokens, baseline());
    EXPECT_FALSE(l.runner->offload().disk_stats().has_value());  // the layers are packed
    auto* cache = l.runner->expert_cache();
    ASSERT_NE(cache, nullptr);
    ASSERT_NE(cache->disk(), nullptr);
    const auto disk = cache->disk()->stats();
    EXPECT_EQ(disk.entries, 5u);
    EXPECT_GT(disk.reads, 0u);
    // Every expert copied to the device came through the tier.
    EXPECT_EQ(disk.acquires, cache->stats().loads);
    expect_within_budget(l, budget);

    // The same from the file's mapping (the page cache as the only cache): no entries.
    o.disk_read = "mmap";
    auto m = load(o);
    EXPECT_EQ(m.runner->generate(m.runner->prepare(request()), greedy()).tokens, baseline());
    const auto mapped = m.runner->expert_cache()->disk()->stats();
    EXPECT_EQ(mapped.entries, 0u);
    EXPECT_EQ(mapped.acquires, m.runner->expert_cache()->stats().loads);
    EXPECT_LE(m.engine->host_counter()->current(), units);  // only the layers' slabs
  }
}

// Loading reports progress in checkpoint bytes placed (load_progress.h). Every way of placing
// a weight must count it once: streamed to the device (resident), packed into a host slab
// (layerwise, experts), or left in the file for the disk tier. Whatever the strategy, the
// count is the same, and at least every checkpoint tensor's bytes.
TEST(LoadProgress, EveryStrategyCountsEachWeightOnce) {
  const auto checkpoint = SafetensorsCheckpoint::open(kDir);
  uint64_t thinker_bytes = 0;
  for (const auto& name : checkpoint.names()) {
    if (name.rfind("thinker.", 0) == 0) thinker_bytes += checkpoint.info(name).nbytes;
  }
  auto placed = [](const ThinkerOffloadOptions& o) {
    offload::LoadProgress outer("test", 0, /*interval_s=*/3600);
    load(o);
    return outer.done_bytes();
  };
  const uint64_t resident = placed({});
  EXPECT_GE(resident, thinker_bytes);
  // Buffers (rotary frequencies) come on top of the checkpoint's tensors; not many.
  EXPECT_LE(resident, thinker_bytes + thinker_bytes / 100);

  const auto plan = load(experts(true)).runner->offload().plan();
  size_t units = 0, expert = 0;
  for (const auto& u : plan.units) units += planned_bytes(u);
  for (const auto& e : plan.experts) expert = std::max(expert, planned_bytes(e));
  auto layers_on_disk = layerwise();
  layers_on_disk.disk_read_ahead = 1;  // the smallest cache: 3 units
  layers_on_disk.host_memory_budget_bytes = 3 * layerwise_max_unit();
  auto experts_on_disk = experts(true);
  experts_on_disk.host_memory_budget_bytes = units + 5 * expert;
  for (const auto& [what, o] : std::vector<std::pair<std::string, ThinkerOffloadOptions>>{
           {"layerwise", layerwise()},
           {"layerwise, disk tier", layers_on_disk},
           {"experts", experts(false)},
           {"experts-layerwise, disk tier", experts_on_disk}}) {
    SCOPED_TRACE(what);
    EXPECT_EQ(placed(o), resident);
  }
}

}  // namespace
}  // namespace omni::models
