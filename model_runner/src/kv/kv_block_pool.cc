#include "model_runner/kv/kv_block_pool.h"

#include <ATen/ATen.h>

#include "cpu_offload/check.h"

namespace omni::models {

KvBlockPool::KvBlockPool(const KvPoolShape& shape)
    : shape_(shape),
      in_use_(static_cast<size_t>(shape.num_blocks), 0),
      end_(static_cast<size_t>(shape.num_blocks), 0) {
  OMNI_CHECK(shape.num_layers > 0 && shape.kv_heads > 0 && shape.head_dim > 0 &&
                 shape.block_size > 0 && shape.num_blocks > 0,
             "a KV block pool needs positive sizes (layers ", shape.num_layers, ", kv heads ",
             shape.kv_heads, ", head dim ", shape.head_dim, ", block size ", shape.block_size,
             ", blocks ", shape.num_blocks, ")");
  std::lock_guard<std::mutex> lock(mutex_);
  allocate_memory();
}

void KvBlockPool::allocate_memory() {
  const auto options = at::TensorOptions(shape_.dtype).device(shape_.device);
  const std::vector<int64_t> sizes = {shape_.kv_heads, shape_.num_blocks * shape_.block_size,
                                      shape_.head_dim};
  for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
    keys_.push_back(at::empty(sizes, options));
    values_.push_back(at::empty(sizes, options));
  }
}

uint64_t KvBlockPool::release_memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (used_ > 0 || keys_.empty()) return 0;
  keys_.clear();
  values_.clear();
  return total_bytes();
}

bool KvBlockPool::has_memory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !keys_.empty();
}

int64_t KvBlockPool::blocks_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

int64_t KvBlockPool::allocate(int64_t last) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t n = shape_.num_blocks;
  OMNI_CHECK(last >= -1 && last < n, "KV block ", last, " is not in a pool of ", n);
  int64_t block = -1;
  if (last >= 0 && last + 1 < n && !in_use_[static_cast<size_t>(last + 1)]) {
    block = last + 1;
  } else {
    int64_t best_start = -1, best_size = 0;
    for (int64_t i = 0; i < n;) {
      if (in_use_[static_cast<size_t>(i)]) {
        ++i;
        continue;
      }
      int64_t j = i;
      while (j < n && !in_use_[static_cast<size_t>(j)]) ++j;
      if (j - i > best_size) best_start = i, best_size = j - i;
      i = j;
    }
    OMNI_CHECK(best_start >= 0, "the KV block pool is full (", n, " blocks of ", shape_.block_size,
               " tokens)");
    const bool behind_a_growing_end = best_start > 0 && end_[static_cast<size_t>(best_start - 1)];
    block = behind_a_growing_end ? best_start + best_size / 2 : best_start;
  }
  if (keys_.empty()) allocate_memory();  // back after release_memory()
  in_use_[static_cast<size_t>(block)] = 1;
  if (last >= 0) end_[static_cast<size_t>(last)] = 0;
  end_[static_cast<size_t>(block)] = 1;
  ++used_;
  return block;
}

void KvBlockPool::release(const std::vector<KvRun>& runs) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const KvRun& run : runs) {
    for (int64_t b = run.first_block; b < run.first_block + run.blocks; ++b) {
      OMNI_CHECK(b >= 0 && b < shape_.num_blocks && in_use_[static_cast<size_t>(b)], "KV block ", b,
                 " is released but not in use");
      in_use_[static_cast<size_t>(b)] = 0;
      end_[static_cast<size_t>(b)] = 0;
      --used_;
    }
  }
}

}  // namespace omni::models
