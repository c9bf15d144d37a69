// The KV cache's memory for a serving stage: every layer's keys and values for num_blocks
// blocks of block_size tokens, allocated once when the stage starts. Sequences take blocks as
// they grow and give them back when they end; nothing is reallocated or copied afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace omni::models {

struct KvPoolShape {
  int64_t num_layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens a block holds
  int64_t num_blocks = 0;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;
  // Bytes of one block over all layers, keys and values.
  uint64_t block_bytes() const {
    return static_cast<uint64_t>(num_layers * 2 * kv_heads * head_dim * block_size) *
           c10::elementSize(dtype);
  }
};

// Consecutive blocks first_block .. first_block + blocks - 1 of a pool: their tokens are adjacent
// in the pool's tensors, so attention reads a run as one view.
struct KvRun {
  int64_t first_block = 0;
  int64_t blocks = 0;
};

class KvBlockPool {
 public:
  explicit KvBlockPool(const KvPoolShape& shape);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvPoolShape& shape() const { return shape_; }
  int64_t block_size() const { return shape_.block_size; }
  int64_t num_blocks() const { return shape_.num_blocks; }
  uint64_t block_bytes() const { return shape_.block_bytes(); }
  uint64_t total_bytes() const { return block_bytes() * static_cast<uint64_t>(num_blocks()); }
  int64_t blocks_in_use() const;

  // One free block for a sequence whose last block is `last` (-1: its first): the block right
  // after `last` when free, so that the sequence's run grows; else one in the largest free gap
  // (its start, or its middle when the block before the gap is another sequence's growing end,
  // to leave that sequence room). Throws when every block is taken.
  int64_t allocate(int64_t last);
  // Gives back every block of `runs`.
  void release(const std::vector<KvRun>& runs);
  // Frees the pool's memory while no sequence holds a block (its stage leaves the device);
  // the next allocate() allocates it again. Returns the bytes freed (0 while blocks are held).
  uint64_t release_memory();
  bool has_memory() const;

  // Layer `layer`'s keys / values: [kv_heads, num_blocks * block_size, head_dim]; block b holds
  // positions b * block_size .. (b + 1) * block_size - 1 of the second dimension. Only while the
  // caller holds a block (the memory is there).
  const at::Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const at::Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }

 private:
  void allocate_memory();  // with mutex_ held

  KvPoolShape shape_;
  std::vector<at::Tensor> keys_, values_;  // empty after release_memory()
  mutable std::mutex mutex_;               // guards the rest: sequences end on any thread
  std::vector<uint8_t> in_use_;            // per block
  std::vector<uint8_t> end_;               // per block: the last block of a live sequence
  int64_t used_ = 0;
};

}  // namespace omni::models
