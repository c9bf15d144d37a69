// The KV cache over a block pool: a sequence grows into the block after its end, a new one
// starts where it leaves others room, caches whose blocks are not adjacent return their runs in
// order and hold exactly what a growable cache holds; blocks come back when a cache ends or is
// cleared (not when it is moved), a full pool says so, and only growable caches copy history.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model_runner/kv/kv_block_pool.h"
#include "model_runner/kv/kv_cache.h"

namespace omni::models {
namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kDim = 3, kBlock = 4;

std::shared_ptr<KvBlockPool> pool_of(int64_t blocks) {
  KvPoolShape shape;
  shape.num_layers = kLayers;
  shape.kv_heads = kHeads;
  shape.head_dim = kDim;
  shape.block_size = kBlock;
  shape.num_blocks = blocks;
  return std::make_shared<KvBlockPool>(shape);
}

// Appends `len` random positions to every layer of `cache` and of `reference` (a growable
// cache), and checks that the pooled views, joined in order, equal the reference's.
void append_both(KvCache& cache, KvCache& reference, int64_t len, at::Generator& gen) {
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const auto k = at::randn({1, kHeads, len, kDim}, gen);
    const auto v = at::randn({1, kHeads, len, kDim}, gen);
    const auto runs = cache.append(layer, k, v);
    const auto expected = reference.append(layer, k, v);
    ASSERT_EQ(expected.size(), 1u);
    std::vector<at::Tensor> keys, values;
    for (const auto& [rk, rv] : runs) {
      keys.push_back(rk);
      values.push_back(rv);
    }
    EXPECT_TRUE(at::equal(at::cat(keys, 2), expected[0].first));
    EXPECT_TRUE(at::equal(at::cat(values, 2), expected[0].second));
  }
}

int64_t total_blocks(const KvCache& cache) {
  int64_t n = 0;
  for (const auto& run : cache.runs()) n += run.blocks;
  return n;
}

TEST(KvBlockPool, ASequenceGrowsIntoTheNextBlockAndANewOneLeavesItRoom) {
  auto pool = pool_of(12);
  EXPECT_EQ(pool->block_bytes(), static_cast<uint64_t>(kLayers * 2 * kHeads * kDim * kBlock * 4));
  EXPECT_EQ(pool->total_bytes(), 12 * pool->block_bytes());
  EXPECT_EQ(pool->allocate(-1), 0);  // the first sequence starts at the start
  EXPECT_EQ(pool->allocate(0), 1);   // and grows into the block after its end
  // The next one starts in the middle of the gap behind the first's growing end.
  EXPECT_EQ(pool->allocate(-1), 2 + 10 / 2);
  EXPECT_EQ(pool->allocate(1), 2);
  EXPECT_EQ(pool->blocks_in_use(), 4);
  pool->release({{0, 3}});
  // The gap at the start no longer ends a growing sequence: a new one starts at its start.
  EXPECT_EQ(pool->allocate(-1), 0);
  EXPECT_EQ(pool->blocks_in_use(), 2);
}

TEST(KvCache, BlocksThatAreNotAdjacentHoldWhatAGrowableCacheHolds) {
  auto pool = pool_of(12);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  KvCache a(kLayers), b(kLayers), ref_a(kLayers), ref_b(kLayers);
  a.use_pool(pool);
  b.use_pool(pool);
  append_both(a, ref_a, 5, gen);  // blocks 0, 1
  append_both(b, ref_b, 3, gen);  // block 7: the middle of the gap behind a
  // Decoding together until the pool is full: a grows up to b's start, then goes on elsewhere.
  while (a.length() < 32) {
    append_both(a, ref_a, 1, gen);
    if (b.length() < 16) append_both(b, ref_b, 1, gen);
  }
  EXPECT_EQ(pool->blocks_in_use(), 12);
  EXPECT_EQ(total_blocks(a), 8);
  EXPECT_EQ(total_blocks(b), 4);
  EXPECT_GT(a.runs().size(), 1u) << "the test needs a cache of more than one run";
  EXPECT_EQ(a.runs().front().first_block, 0);
  // A full pool refuses with an error that says so.
  try {
    append_both(b, ref_b, 1, gen);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("KV block pool is full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.reallocations(), 0);
  EXPECT_EQ(a.bytes_copied(), 0u);
}

TEST(KvCache, BlocksComeBackWhenACacheEndsOrIsClearedNotWhenItMoves) {
  auto pool = pool_of(8);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  KvCache ref(kLayers);
  {
    KvCache a(kLayers);
    a.use_pool(pool);
    append_both(a, ref, 9, gen);
    EXPECT_EQ(pool->blocks_in_use(), 3);
    KvCache moved = std::move(a);
    EXPECT_EQ(pool->blocks_in_use(), 3);
    EXPECT_EQ(moved.length(), 9);
    moved.clear();
    EXPECT_EQ(pool->blocks_in_use(), 0);
    EXPECT_TRUE(moved.pooled());  // a cleared cache takes blocks again
    KvCache other(kLayers);
    other.use_pool(pool);
    KvCache ref_other(kLayers);
    append_both(other, ref_other, 1, gen);
    EXPECT_EQ(pool->blocks_in_use(), 1);
  }
  EXPECT_EQ(pool->blocks_in_use(), 0);  // both ended
}

TEST(KvCache, OnlyAGrowableCacheReallocatesAndCopiesItsHistory) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  KvCache growable(kLayers), pooled(kLayers), ref(kLayers), ref_pooled(kLayers);
  growable.set_block_size(kBlock);
  pooled.use_pool(pool_of(4));
  for (int i = 0; i < 9; ++i) {
    append_both(growable, ref, 1, gen);  // (checks growable against another growable cache)
    append_both(pooled, ref_pooled, 1, gen);
  }
  // Capacity 4 -> 8 -> 12: two growths, copying 4 then 8 positions of every layer's K and V.
  EXPECT_EQ(growable.reallocations(), 2);
  const uint64_t position_bytes = kHeads * kDim * sizeof(float);
  EXPECT_EQ(growable.bytes_copied(), (4 + 8) * position_bytes * 2 * kLayers);
  EXPECT_EQ(growable.blocks(), 3);
  EXPECT_EQ(pooled.reallocations(), 0);
  EXPECT_EQ(pooled.bytes_copied(), 0u);
}

}  // namespace
}  // namespace omni::models
