// One sequence's keys and values for every layer of a decoder. Either in blocks of a stage's
// KvBlockPool (serving: nothing is reallocated or copied as the sequence grows) or, without a
// pool, in tensors of its own that grow by doubling or by whole blocks (tests, one-off runs).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model_runner/kv/kv_block_pool.h"

namespace omni::models {

// Cached keys and values of one run of positions: [n, kv_heads, len, head_dim] views.
using KeysValues = std::pair<at::Tensor, at::Tensor>;

class KvCache {
 public:
  explicit KvCache(int64_t num_layers) : keys_(num_layers), values_(num_layers) {}
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() { clear(); }

  int64_t length() const { return length_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  // Takes its blocks from `pool` (whose block size it then uses); before the first append.
  void use_pool(std::shared_ptr<KvBlockPool> pool);
  bool pooled() const { return pool_ != nullptr; }
  // Tokens per block without a pool (0: double instead); before the first append.
  void set_block_size(int64_t tokens);
  int64_t block_size() const { return pool_ ? pool_->block_size() : block_size_; }
  // Blocks that `tokens` cached tokens take (a block size must be set).
  int64_t blocks_for(int64_t tokens) const;
  // Blocks held now: the pool's blocks, or the growable tensors' capacity in blocks.
  int64_t blocks() const;

  // Appends `k`, `v` [1, kv_heads, L, head_dim] to `layer` and returns views of everything
  // cached for it so far, in order: one per run of adjacent positions (always one without a
  // pool). The last layer of a step advances length().
  std::vector<KeysValues> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Drops everything; a pooled cache gives its blocks back (and stays pooled).
  void clear();

  // Times the growable tensors were reallocated (each time, every layer's; 0 with a pool) and
  // the history bytes those reallocations copied: what a pool avoids.
  int64_t reallocations() const { return reallocations_; }
  uint64_t bytes_copied() const { return bytes_copied_; }
  const std::vector<KvRun>& runs() const { return runs_; }

 private:
  void reserve_blocks(int64_t tokens);  // pooled: blocks for `tokens` positions
  std::vector<KeysValues> pooled_append(int64_t layer, const at::Tensor& k, const at::Tensor& v);

  std::vector<at::Tensor> keys_, values_;  // without a pool: [1, kv_heads, capacity, head_dim]
  std::shared_ptr<KvBlockPool> pool_;
  std::vector<KvRun> runs_;  // pooled: the sequence's blocks in order
  int64_t length_ = 0;
  int64_t block_size_ = 0;
  int64_t reallocations_ = 0;
  uint64_t bytes_copied_ = 0;
};

// One KV cache per row of a batch: row i of the hidden states continues caches[i]'s sequence.
// One cache alone holds every row (rows of one length); empty: no cache.
using KvBatch = std::vector<KvCache*>;

}  // namespace omni::models
