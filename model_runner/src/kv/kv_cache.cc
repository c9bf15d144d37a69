#include "model_runner/kv/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models {

KvCache::KvCache(KvCache&& other) noexcept
    : keys_(std::move(other.keys_)),
      values_(std::move(other.values_)),
      pool_(std::move(other.pool_)),
      runs_(std::move(other.runs_)),
      length_(other.length_),
      block_size_(other.block_size_),
      reallocations_(other.reallocations_),
      bytes_copied_(other.bytes_copied_) {
  other.runs_.clear();
  other.length_ = 0;
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this != &other) {
    clear();
    keys_ = std::move(other.keys_);
    values_ = std::move(other.values_);
    pool_ = std::move(other.pool_);
    runs_ = std::move(other.runs_);
    length_ = other.length_;
    block_size_ = other.block_size_;
    reallocations_ = other.reallocations_;
    bytes_copied_ = other.bytes_copied_;
    other.runs_.clear();
    other.length_ = 0;
  }
  return *this;
}

void KvCache::use_pool(std::shared_ptr<KvBlockPool> pool) {
  OMNI_CHECK(length_ == 0, "a KV cache takes a pool before its first append");
  OMNI_CHECK(pool == nullptr || pool->shape().num_layers == num_layers(), "a KV pool of ",
             pool ? pool->shape().num_layers : 0, " layers cannot hold a cache of ", num_layers());
  pool_ = std::move(pool);
}

void KvCache::set_block_size(int64_t tokens) {
  OMNI_CHECK(length_ == 0, "a KV cache's block size is set before its first append");
  block_size_ = tokens;
}

int64_t KvCache::blocks_for(int64_t tokens) const {
  const int64_t size = block_size();
  OMNI_CHECK(size > 0, "KvCache::blocks_for needs a block size");
  return (tokens + size - 1) / size;
}

int64_t KvCache::blocks() const {
  if (pool_) {
    int64_t n = 0;
    for (const KvRun& run : runs_) n += run.blocks;
    return n;
  }
  if (keys_.empty() || !keys_[0].defined() || block_size_ == 0) return 0;
  return blocks_for(keys_[0].size(2));
}

std::vector<KeysValues> KvCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  OMNI_CHECK(layer >= 0 && layer < num_layers(), "KV cache has no layer ", layer);
  if (pool_) return pooled_append(layer, k, v);
  const int64_t add = k.size(2);
  at::Tensor& keys = keys_[layer];
  at::Tensor& values = values_[layer];
  const int64_t needed = length_ + add;
  if (!keys.defined() || keys.size(2) < needed) {
    const int64_t capacity =
        block_size_ > 0 ? blocks_for(needed) * block_size_
                        : std::max<int64_t>(needed, keys.defined() ? 2 * keys.size(2) : 64);
    auto grown_k = at::empty({k.size(0), k.size(1), capacity, k.size(3)}, k.options());
    auto grown_v = at::empty({v.size(0), v.size(1), capacity, v.size(3)}, v.options());
    if (keys.defined() && length_ > 0) {
      grown_k.narrow(2, 0, length_).copy_(keys.narrow(2, 0, length_));
      grown_v.narrow(2, 0, length_).copy_(values.narrow(2, 0, length_));
      if (layer == 0) ++reallocations_;  // once per growth, for every layer
      bytes_copied_ += 2 * static_cast<uint64_t>(keys.narrow(2, 0, length_).nbytes());
    }
    keys = grown_k;
    values = grown_v;
  }
  keys.narrow(2, length_, add).copy_(k);
  values.narrow(2, length_, add).copy_(v);
  std::vector<KeysValues> result = {{keys.narrow(2, 0, needed), values.narrow(2, 0, needed)}};
  if (layer == num_layers() - 1) length_ = needed;
  return result;
}

void KvCache::reserve_blocks(int64_t tokens) {
  const int64_t size = pool_->block_size();
  for (int64_t have = blocks(); have * size < tokens; ++have) {
    const int64_t last = runs_.empty() ? -1 : runs_.back().first_block + runs_.back().blocks - 1;
    const int64_t block = pool_->allocate(last);
    if (block == last + 1 && !runs_.empty()) {
      ++runs_.back().blocks;
    } else {
      runs_.push_back({block, 1});
    }
  }
}

std::vector<KeysValues> KvCache::pooled_append(int64_t layer, const at::Tensor& k,
                                               const at::Tensor& v) {
  OMNI_CHECK(k.size(0) == 1, "a pooled KV cache holds one sequence, not a batch of ", k.size(0));
  const int64_t add = k.size(2), needed = length_ + add, size = pool_->block_size();
  if (layer == 0) reserve_blocks(needed);  // every layer uses the same blocks
  const at::Tensor& keys = pool_->keys(layer);
  const at::Tensor& values = pool_->values(layer);
  const at::Tensor new_keys = k[0], new_values = v[0];  // [kv_heads, add, head_dim]
  std::vector<KeysValues> result;
  int64_t position = 0;  // of the sequence, at the start of the run
  for (const KvRun& run : runs_) {
    if (position >= needed) break;
    const int64_t slot = run.first_block * size;
    const int64_t len = std::min(run.blocks * size, needed - position);
    // The new positions [length_, needed) that fall in this run.
    const int64_t from = std::max(length_, position), to = position + len;
    if (from < to) {
      keys.narrow(1, slot + from - position, to - from)
          .copy_(new_keys.narrow(1, from - length_, to - from));
      values.narrow(1, slot + from - position, to - from)
          .copy_(new_values.narrow(1, from - length_, to - from));
    }
    result.emplace_back(keys.narrow(1, slot, len).unsqueeze(0),
                        values.narrow(1, slot, len).unsqueeze(0));
    position += len;
  }
  if (layer == num_layers() - 1) length_ = needed;
  return result;
}

void KvCache::clear() {
  if (pool_ && !runs_.empty()) pool_->release(runs_);
  runs_.clear();
  for (auto& t : keys_) t = at::Tensor();
  for (auto& t : values_) t = at::Tensor();
  length_ = 0;
}

}  // namespace omni::models
