// The disk tier (disk_tier.h): units read from the files the weights came from, into a bounded
// cache of host entries, bitwise as their packed slabs would hold them (converted where the
// model wants another dtype); an entry refilled only after the copy that read it (strict mode:
// a copy's bytes land when it is waited for, so an early refill would put the wrong unit on
// the device); the host placement under a budget; errors that name the budget and the file.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/disk_probe.h"
#include "cpu_offload/disk_tier.h"
#include "cpu_offload/expert_cache.h"
#include "cpu_offload/offload_plan.h"

namespace omni::offload {
namespace {

namespace fs = std::filesystem;

// Tensors written one after the other to a file (a stand-in for a safetensors shard: the disk
// tier only needs offsets), with their extents.
struct WeightFile {
  fs::path path;
  TensorFiles files;
  ~WeightFile() { fs::remove(path); }
};

std::unique_ptr<WeightFile> write_file(const std::vector<std::pair<std::string, at::Tensor>>& t,
                                       const std::string& tag) {
  auto out = std::make_unique<WeightFile>();
  out->path = fs::temp_directory_path() /
              ("omni_disk_tier_" + tag + "_" + std::to_string(::getpid()) + ".bin");
  std::ofstream f(out->path, std::ios::binary);
  uint64_t offset = 8;  // not at 0, as in a safetensors file (its header comes first)
  f.write("HEADER..", 8);
  for (const auto& [name, tensor] : t) {
    const auto c = tensor.contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    out->files[name] = TensorFileExtent{out->path.string(), offset, c.nbytes(), c.scalar_type()};
    offset += c.nbytes();
  }
  return out;
}

// The bytes of `path` (to write back a file a test cut short).
std::string file_content(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Unit u: "u.w" [8 x 16] float32, "u.b" [40] float32 converted to bfloat16 in the unit.
std::vector<std::pair<std::string, at::Tensor>> unit_tensors(int u) {
  at::manual_seed(u);
  return {{"unit" + std::to_string(u) + ".w", at::randn({8, 16})},
          {"unit" + std::to_string(u) + ".b", at::randn({40})}};
}

DtypeByName convert_biases(int units) {
  DtypeByName convert;
  for (int u = 0; u < units; ++u) convert["unit" + std::to_string(u) + ".b"] = at::kBFloat16;
  return convert;
}

std::shared_ptr<TransferEngine> strict_engine() {
  TransferEngineOptions options;
  options.sim_strict = true;
  return make_cpu_sim_engine(options);
}

struct Units {
  std::unique_ptr<WeightFile> file;
  std::vector<std::unique_ptr<OffloadUnit>> packed;  // the reference slabs
  std::vector<std::unique_ptr<OffloadUnit>> layout;  // the disk tier's units
};

// With `convert`, each unit's bias is stored float32 and used bfloat16 (read through the
// bounce buffer); without, every tensor is used as stored and the unit is read in place.
Units make_units(int count, TransferEngine& engine, const std::string& tag, bool convert = true) {
  Units out;
  std::vector<std::pair<std::string, at::Tensor>> all;
  const DtypeByName convert_dtypes = convert ? convert_biases(count) : DtypeByName{};
  const DtypeByName* conversions = &convert_dtypes;
  for (int u = 0; u < count; ++u) {
    auto tensors = unit_tensors(u);
    all.insert(all.end(), tensors.begin(), tensors.end());
    std::vector<std::pair<std::string, at::Tensor>> copies;
    for (const auto& [n, t] : tensors) copies.emplace_back(n, t.clone());
    out.packed.push_back(std::make_unique<OffloadUnit>("unit" + std::to_string(u), copies, engine,
                                                       /*pin=*/true, conversions));
    out.layout.push_back(
        OffloadUnit::layout_only("unit" + std::to_string(u), tensors, conversions));
  }
  out.file = write_file(all, tag);
  return out;
}

// An acquired unit's bytes in its slab layout (what copy_ops puts on the device).
std::vector<uint8_t> slab_of(const AcquiredUnit& host, size_t unit_bytes) {
  std::vector<uint8_t> slab(unit_bytes, 0);
  for (const HostSpan& span : host.spans) {
    EXPECT_LE(span.host_offset + span.bytes, host.buffer.bytes());
    EXPECT_LE(span.unit_offset + span.bytes, unit_bytes);
    std::memcpy(slab.data() + span.unit_offset, host.buffer.data() + span.host_offset, span.bytes);
  }
  return slab;
}

// Whether `path`'s file system takes O_DIRECT reads (else the tier reads buffered).
bool takes_direct_reads(const fs::path& path) {
  return measure_sequential_read(path.string(), 4096, 4096).direct;
}

bool same_tensor_bytes(const OffloadUnit& unit, const uint8_t* a, const uint8_t* b) {
  for (const auto& t : unit.tensors()) {
    if (std::memcmp(a + t.offset, b + t.offset, t.nbytes) != 0) return false;
  }
  return true;
}

// (direct reads, a converted tensor in each unit)
class DiskTierReads : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Direct (O_DIRECT, one aligned read per run of adjacent tensors; in place when no tensor is
// converted) and buffered reads.
TEST_P(DiskTierReads, ReadEachUnitAsItsPackedSlabHoldsIt) {
  const auto [direct, convert] = GetParam();
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(
      3, *engine, std::string(direct ? "direct" : "buffered") + (convert ? "c" : ""), convert);
  DiskTierOptions options;
  // Two entries; units this small read in place only when told their slack is fine.
  const bool in_place = direct && !convert;
  options.cache_bytes = 2 * (units.packed[0]->bytes() + (in_place ? DiskTier::kInPlaceSlack : 0));
  options.in_place_max_slack = 1e6;
  options.direct = direct;
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) {
    ASSERT_TRUE(DiskTier::readable(*u, units.file->files));
    tier.add(*u, units.file->files);
  }
  for (int round = 0; round < 2; ++round) {
    for (int u = 0; u < 3; ++u) {
      const AcquiredUnit host = tier.acquire(u);
      EXPECT_EQ(host.spans.size(), direct && !convert ? 2u : 1u);  // per tensor when in place
      EXPECT_TRUE(same_tensor_bytes(*units.packed[u],
                                    slab_of(host, units.packed[u]->bytes()).data(),
                                    units.packed[u]->host().data()))
          << "unit " << u << " round " << round;
      tier.release(u, Event());
    }
  }
  const auto s = tier.stats();
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.acquires, 6u);
  EXPECT_EQ(s.reads, s.misses);
  EXPECT_EQ(s.read_bytes, s.reads * units.packed[0]->bytes());
  // Two entries, three units in turn: every acquire misses (LRU evicts the next one).
  EXPECT_EQ(s.misses, 6u);
  EXPECT_GT(s.read_bytes_per_s(), 0.0);
  // In place: every read went straight into its entry, where the file system allows O_DIRECT
  // (the file starts its tensors 8 bytes into a block, so the entry's offset is not 0).
  EXPECT_EQ(s.in_place_reads, in_place && takes_direct_reads(units.file->path) ? s.reads : 0u);
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, DiskTierReads,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param) ? "direct"
                                                                            : "buffered") +
                                  (std::get<1>(param_info.param) ? "_converted" : "_as_stored");
                         });

TEST(DiskTier, ReadAheadMakesTheNextAcquireAHit) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(4, *engine, "ahead");
  DiskTierOptions options;
  options.cache_bytes = 3 * units.packed[0]->bytes();
  options.min_entries = 1;  // read-aheads may take all but one entry
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  tier.read_ahead(1);
  tier.read_ahead(2);
  tier.read_ahead(3);  // refused: it would leave no entry for a unit needed now
  EXPECT_FALSE(tier.cached(3));
  for (int u : {1, 2}) {
    const AcquiredUnit host = tier.acquire(u);
    EXPECT_TRUE(same_tensor_bytes(*units.packed[u], slab_of(host, units.packed[u]->bytes()).data(),
                                  units.packed[u]->host().data()));
    tier.release(u, Event());
  }
  EXPECT_TRUE(tier.cached(1));
  EXPECT_FALSE(tier.cached(0));
  const auto s = tier.stats();
  EXPECT_EQ(s.read_aheads, 2u);
  EXPECT_EQ(s.read_ahead_used, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 0u);
}

// A slow disk: every entry not taken by a copy is still being read ahead when another unit is
// needed. The acquire waits for the first read to finish and takes its entry, rather than
// failing for want of one.
TEST(DiskTier, AnAcquireWaitsForReadAheadsWhenEveryOtherEntryIsBeingRead) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(4, *engine, "slow");
  DiskTierOptions options;
  options.cache_bytes = 3 * units.packed[0]->bytes();
  options.min_entries = 1;
  options.reader_threads = 3;
  options.before_read = [](int unit) {
    if (unit < 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  tier.read_ahead(0);
  tier.read_ahead(1);
  const AcquiredUnit second = tier.acquire(2);  // the third entry, read at once
  const auto start = std::chrono::steady_clock::now();
  const AcquiredUnit third = tier.acquire(3);  // entries: two being read, one held
  EXPECT_GT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50))
      << "acquire(3) did not wait: the read-aheads were already over (the test proves nothing)";
  const size_t unit_bytes = units.packed[0]->bytes();
  EXPECT_TRUE(same_tensor_bytes(*units.packed[2], slab_of(second, unit_bytes).data(),
                                units.packed[2]->host().data()));
  EXPECT_TRUE(same_tensor_bytes(*units.packed[3], slab_of(third, unit_bytes).data(),
                                units.packed[3]->host().data()));
  tier.release(2, Event());
  tier.release(3, Event());
  EXPECT_EQ(tier.stats().read_aheads, 2u);
}

// A read that fails inside the expert cache (the file shrank) leaves no slot claiming an
// expert that never arrived: once the file is back, the expert loads, stays, and hits.
TEST(DiskTier, AFailedExpertReadLeavesTheCacheConsistent) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  constexpr int kUnits = 3;
  Units units = make_units(kUnits, *engine, "expertfail");
  const std::string content = file_content(units.file->path);
  auto tier = std::make_unique<DiskTier>(engine, [&] {
    DiskTierOptions o;
    o.cache_bytes = 2 * units.packed[0]->bytes();
    return o;
  }());
  for (auto& u : units.layout) u->unbind();  // as make_expert_cache leaves them
  ExpertCacheOptions cache_options;
  cache_options.budget_bytes = 2 * units.packed[0]->bytes();  // two slots
  ExpertCache cache(std::move(units.layout), engine, cache_options, std::move(tier),
                    &units.file->files);
  ASSERT_EQ(cache.slots(), 2u);
  fs::resize_file(units.file->path, 64);
  EXPECT_THROW(cache.ensure({2}), omni::Error);
  std::ofstream(units.file->path, std::ios::binary | std::ios::trunc) << content;
  cache.ensure({2});  // into a free slot
  cache.ensure({0});  // the other free slot: expert 2 stays
  EXPECT_TRUE(cache.unit(2).bound()) << "expert 2 was unbound by a slot that claimed it";
  const auto before = cache.stats();
  cache.ensure({2});
  const auto after = cache.stats();
  EXPECT_EQ(after.hits, before.hits + 1) << "expert 2 left the device for expert 0";
  EXPECT_EQ(after.evictions, 0u);
}

// The experts one call misses are read side by side: the cache queues every read before it
// waits for the first (one acquire() after another would keep one reader busy at a time).
TEST(DiskTier, AnExpertCallReadsItsMissesSideBySide) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  constexpr int kUnits = 3;
  Units units = make_units(kUnits, *engine, "sidebyside");
  std::atomic<int> reading{0}, most{0};
  auto tier = std::make_unique<DiskTier>(engine, [&] {
    DiskTierOptions o;
    o.cache_bytes = kUnits * units.packed[0]->bytes();
    o.reader_threads = 2;
    o.before_read = [&](int) {
      const int now = ++reading;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      --reading;
    };
    return o;
  }());
  for (auto& u : units.layout) u->unbind();  // as make_expert_cache leaves them
  ExpertCacheOptions cache_options;
  cache_options.budget_bytes = kUnits * units.packed[0]->bytes();
  ExpertCache cache(std::move(units.layout), engine, cache_options, std::move(tier),
                    &units.file->files);
  cache.ensure({0, 1, 2});
  EXPECT_EQ(most.load(), 2) << "the misses were read one at a time";
  for (int u = 0; u < kUnits; ++u) {
    const at::Tensor got = cache.unit(u).tensors()[0].tensor.cpu();
    EXPECT_TRUE(at::equal(got, unit_tensors(u)[0].second)) << "unit " << u;
  }
}

// One reader, held in its first read while more are queued: a read someone waits for goes
// before the read-aheads queued earlier, and a queued read-ahead that someone now waits for
// moves up with it. Speculative reads must not delay the reads the model is stalled on.
TEST(DiskTier, ReadsSomeoneWaitsForGoBeforeQueuedReadAheads) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(5, *engine, "priority");
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> go, reading_first;
  std::shared_future<void> may_go = go.get_future().share();
  DiskTierOptions options;
  options.cache_bytes = 5 * units.packed[0]->bytes();
  options.min_entries = 1;
  options.reader_threads = 1;
  options.before_read = [&](int unit) {
    if (unit == 0) {  // the reader is busy while the test queues
      reading_first.set_value();
      may_go.wait();
    }
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(unit);
  };
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  tier.read_ahead(0);  // taken by the reader, held in before_read
  reading_first.get_future().wait();
  tier.read_ahead(1);
  tier.read_ahead(2);
  tier.read_ahead(3);
  // Wanted now: 4 (not read yet) and 3 (a queued read-ahead; acquire_all takes it first).
  auto wanted = std::async(std::launch::async, [&] { return tier.acquire_all({4, 3}); });
  while (tier.stats().acquires < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  go.set_value();
  const auto host = wanted.get();
  tier.release(4, Event());
  tier.release(3, Event());
  for (int u : {1, 2}) {
    tier.acquire(u);
    tier.release(u, Event());
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 3, 4, 1, 2}));
}

// acquire_all() takes the units it holds before it picks entries for the others: a miss must
// not evict a unit the same call is about to use.
TEST(DiskTier, AcquireAllKeepsTheUnitsItAlreadyHolds) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(3, *engine, "keepheld");
  DiskTierOptions options;
  options.cache_bytes = 2 * units.packed[0]->bytes();
  options.min_entries = 1;
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  for (int u : {0, 2}) {  // unit 0 is the least recently used of the two entries
    tier.acquire(u);
    tier.release(u, Event());
  }
  tier.reset_stats();
  const auto host = tier.acquire_all({1, 0});
  const size_t unit_bytes = units.packed[0]->bytes();
  for (int i : {0, 1}) {
    const int u = i == 0 ? 1 : 0;
    EXPECT_TRUE(same_tensor_bytes(*units.packed[u], slab_of(host[i], unit_bytes).data(),
                                  units.packed[u]->host().data()))
        << "unit " << u;
  }
  tier.release(1, Event());
  tier.release(0, Event());
  EXPECT_EQ(tier.stats().hits, 1u);
  EXPECT_EQ(tier.stats().reads, 1u) << "unit 0 was evicted for unit 1 and read again";
}

// A failed read in acquire_all() leaves none of its units taken: every entry can be refilled.
TEST(DiskTier, AFailedAcquireAllTakesNoEntry) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  constexpr int kUnits = 6;
  Units units = make_units(kUnits, *engine, "allornothing");
  const std::string content = file_content(units.file->path);
  DiskTierOptions options;
  options.cache_bytes = 3 * units.packed[0]->bytes();
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  // Units 0 and 1 lie in the first bytes of the file; unit 2 is cut off.
  fs::resize_file(units.file->path, 8 + 2 * 4 * (8 * 16 + 40) + 16);
  EXPECT_THROW(tier.acquire_all({0, 1, 2}), omni::Error);
  std::ofstream(units.file->path, std::ios::binary | std::ios::trunc) << content;
  // Three other units need all three entries: one still taken would make this throw.
  const auto host = tier.acquire_all({3, 4, 5});
  ASSERT_EQ(host.size(), 3u);
  for (int u : {3, 4, 5}) tier.release(u, Event());
}

// Two entries feed copies of six units into six device regions, nobody waiting for the copies
// until the end. In strict mode a copy's bytes land when it is waited for: had an entry been
// refilled while its copy was pending, the region would get the later unit's bytes.
// Both layouts: the slab's (a converted tensor) and the file's (read in place).
class DiskTierRefill : public ::testing::TestWithParam<bool> {};

TEST_P(DiskTierRefill, AnEntryIsRefilledOnlyAfterTheCopyThatReadsIt) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  constexpr int kUnits = 6;
  Units units = make_units(kUnits, *engine, GetParam() ? "order" : "orderinplace", GetParam());
  const size_t unit_bytes = units.packed[0]->bytes();
  DiskTierOptions options;
  // Two entries (with the in-place slack for the file layout, which these small units are
  // allowed).
  options.cache_bytes = 2 * (unit_bytes + (GetParam() ? 0 : DiskTier::kInPlaceSlack));
  options.in_place_max_slack = 1e6;
  DiskTier tier(engine, options);
  for (const auto& u : units.layout) tier.add(*u, units.file->files);
  DeviceBuffer device = engine->allocate_device(kUnits * unit_bytes);
  std::vector<Event> copies;
  for (int u = 0; u < kUnits; ++u) {
    copies.push_back(engine->copy_async(tier.copy_ops(u, device, u * unit_bytes), {}));
    tier.release(u, copies.back());
    tier.read_ahead((u + 1) % kUnits);
  }
  for (const auto& e : copies) engine->compute_wait(e);
  const at::Tensor got = device.bytes_tensor().cpu();
  for (int u = 0; u < kUnits; ++u) {
    EXPECT_TRUE(same_tensor_bytes(*units.packed[u], got.data_ptr<uint8_t>() + u * unit_bytes,
                                  units.packed[u]->host().data()))
        << "unit " << u << " reached the device with another unit's bytes";
  }
  EXPECT_EQ(tier.stats().entries, 2u);
  if (!GetParam() && takes_direct_reads(units.file->path)) {
    EXPECT_EQ(tier.stats().in_place_reads, tier.stats().reads);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DiskTierRefill, ::testing::Bool(), [](const auto& param_info) {
  return param_info.param ? "slab_layout" : "file_layout";
});

// mmap reads: no entries of our own, one copy per tensor from the file's mapping.
TEST(DiskTier, MmapReadsCopyEachTensorFromTheMapping) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  constexpr int kUnits = 3;
  Units units = make_units(kUnits, *engine, "mmap");
  DiskTierOptions options;
  options.read = DiskRead::kMmap;
  DiskTier tier(engine, options);
  // The biases are converted to bfloat16 in the unit: a mapping cannot do that.
  EXPECT_FALSE(DiskTier::readable(*units.layout[0], units.file->files, DiskRead::kMmap));
  EXPECT_THROW(tier.add(*units.layout[0], units.file->files), omni::Error);
  // Without the conversion it can.
  std::vector<std::unique_ptr<OffloadUnit>> plain;
  std::vector<std::unique_ptr<OffloadUnit>> packed;
  for (int u = 0; u < kUnits; ++u) {
    auto tensors = unit_tensors(u);
    plain.push_back(OffloadUnit::layout_only("unit" + std::to_string(u), tensors));
    std::vector<std::pair<std::string, at::Tensor>> copies;
    for (const auto& [n, t] : tensors) copies.emplace_back(n, t.clone());
    packed.push_back(
        std::make_unique<OffloadUnit>("unit" + std::to_string(u), copies, *engine, true));
    ASSERT_TRUE(DiskTier::readable(*plain[u], units.file->files, DiskRead::kMmap));
    tier.add(*plain[u], units.file->files);
  }
  EXPECT_EQ(tier.entries(), 0u);
  const size_t unit_bytes = plain[0]->bytes();
  DeviceBuffer device = engine->allocate_device(kUnits * unit_bytes);
  std::vector<Event> copies;
  for (int u = 0; u < kUnits; ++u) {
    const auto ops = tier.copy_ops(u, device, u * unit_bytes);
    EXPECT_EQ(ops.size(), plain[u]->tensors().size());
    copies.push_back(engine->copy_async(ops, {}));
    tier.release(u, copies.back());
  }
  for (const auto& e : copies) engine->compute_wait(e);
  const at::Tensor got = device.bytes_tensor().cpu();
  for (int u = 0; u < kUnits; ++u) {
    EXPECT_TRUE(same_tensor_bytes(*packed[u], got.data_ptr<uint8_t>() + u * unit_bytes,
                                  packed[u]->host().data()))
        << "unit " << u;
  }
  EXPECT_EQ(tier.stats().read_bytes, kUnits * unit_bytes);
}

TEST(DiskTier, ErrorsNameTheBudgetTheTensorAndTheFile) {
  auto engine = strict_engine();
  auto compute = engine->enter_compute();
  Units units = make_units(3, *engine, "errors");
  {
    DiskTierOptions options;
    options.cache_bytes = units.packed[0]->bytes();  // one entry, two needed
    DiskTier tier(engine, options);
    for (const auto& u : units.layout) tier.add(*u, units.file->files);
    try {
      tier.acquire(0);
      FAIL() << "a cache below two entries was accepted";
    } catch (const omni::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--host-memory-budget"), std::string::npos) << e.what();
    }
  }
  {
    TensorFiles missing = units.file->files;
    missing.erase("unit1.w");
    EXPECT_FALSE(DiskTier::readable(*units.layout[1], missing));
    DiskTier tier(engine, DiskTierOptions{});
    try {
      tier.add(*units.layout[1], missing);
      FAIL() << "a tensor without a file extent was accepted";
    } catch (const omni::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unit1.w"), std::string::npos) << e.what();
    }
  }
  {
    DiskTierOptions options;
    options.cache_bytes = 4 * units.packed[0]->bytes();
    DiskTier tier(engine, options);
    for (const auto& u : units.layout) tier.add(*u, units.file->files);
    fs::resize_file(units.file->path, 64);  // the file shrinks under the engine
    try {
      tier.acquire(2);
      FAIL() << "a read past the end of the file succeeded";
    } catch (const omni::Error& e) {
      EXPECT_NE(std::string(e.what()).find(units.file->path.string()), std::string::npos)
          << e.what();
    }
  }
}

UnitPlan planned(const std::string& name, size_t bytes) {
  UnitPlan p;
  p.name = name;
  p.tensor_names = {name + ".w"};
  p.bytes = bytes;
  return p;
}

TEST(DiskTier, HostPlacementSendsExpertsToDiskFirst) {
  OffloadPlan plan;
  plan.strategy = Strategy::kLayerwise;
  for (int i = 0; i < 4; ++i) plan.units.push_back(planned("layer" + std::to_string(i), 1000));
  for (int i = 0; i < 16; ++i) plan.experts.push_back(planned("expert" + std::to_string(i), 500));
  OffloadConfig config;
  config.num_gpu_layers = 1;
  config.disk_read_ahead = 1;
  const size_t unit = 1000 + kTensorAlignment, expert = 500 + kTensorAlignment;
  // No budget, or enough for all: nothing on disk.
  EXPECT_FALSE(place_on_host(plan, config).experts_on_disk);
  config.host_memory_budget_bytes = 4 * unit + 16 * expert;
  EXPECT_FALSE(place_on_host(plan, config).experts_on_disk);
  // Less: the experts go, their cache is what the layers leave.
  config.host_memory_budget_bytes = 4 * unit + 5 * expert;
  auto p = place_on_host(plan, config);
  EXPECT_TRUE(p.experts_on_disk);
  EXPECT_FALSE(p.units_on_disk);
  EXPECT_EQ(p.expert_cache_bytes, 5 * expert);
  // Less than the layers and two experts: the layers go too, with (1 + 1 + 1) units of cache.
  config.host_memory_budget_bytes = 3 * unit + 2 * expert + 10;
  p = place_on_host(plan, config);
  EXPECT_TRUE(p.units_on_disk);
  EXPECT_EQ(p.unit_cache_bytes, 3 * unit);
  EXPECT_EQ(p.expert_cache_bytes, 2 * expert + 10);
  // Below that: an error naming the budget.
  config.host_memory_budget_bytes = 3 * unit;
  try {
    place_on_host(plan, config);
    FAIL() << "a budget below the disk tier's minimum was accepted";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--host-memory-budget"), std::string::npos) << e.what();
  }
  // Four units where the tier's least cache is four units (1 + 1 + 2 read ahead): the disk
  // saves nothing, and the error names what would work, the units and two experts.
  config.disk_read_ahead = 2;
  config.host_memory_budget_bytes = 3 * unit + 2 * expert + 10;
  try {
    place_on_host(plan, config);
    FAIL() << "a budget below every unit was accepted with a cache as large as all of them";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is below the " + std::to_string(4 * unit + 2 * expert) +
                                         " bytes of the streamed units plus two experts"),
              std::string::npos)
        << e.what();
  }
  config.disk_read_ahead = 1;
  // A strategy that keeps its units on the host cannot go below them.
  plan.strategy = Strategy::kComponent;
  config.host_memory_budget_bytes = 3 * unit + 2 * expert + 10;
  EXPECT_THROW(place_on_host(plan, config), omni::Error);
}

// The raw read the bench sets the tier's throughput against: every byte asked for (the file's
// size at most, whole blocks past the end being short), in either mode; errors name the file.
TEST(DiskProbe, ReadsWhatWasAskedUpToTheEndOfTheFile) {
  const fs::path path =
      fs::temp_directory_path() / ("omni_disk_probe_" + std::to_string(::getpid()) + ".bin");
  const uint64_t size = 3 * 8192 + 100;  // not a whole number of blocks
  {
    std::ofstream f(path, std::ios::binary);
    const std::string bytes(size, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(size));
  }
  const SequentialRead all = measure_sequential_read(path.string(), 1ull << 30, 8192);
  EXPECT_EQ(all.bytes, size);
  EXPECT_EQ(all.block, 8192u);
  EXPECT_GT(all.seconds, 0);
  EXPECT_GT(all.bytes_per_s(), 0);
  EXPECT_NE(all.to_json().find("\"bytes\": " + std::to_string(size)), std::string::npos)
      << all.to_json();
  const SequentialRead part = measure_sequential_read(path.string(), 10000, 4096);
  EXPECT_EQ(part.bytes, 10000u);  // three reads, the last one cut to what was asked
  try {
    measure_sequential_read(path.string(), 10000, 5000);
    FAIL() << "a block that O_DIRECT cannot take was accepted";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 4096"), std::string::npos) << e.what();
  }
  fs::remove(path);
  try {
    measure_sequential_read(path.string(), 10000);
    FAIL() << "a missing file was read";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni::offload
