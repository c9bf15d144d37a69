#include "worker/runtime/kv_manager.h"

#include <algorithm>

#include "cpu_offload/check.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

KvManager::KvManager(models::KvPoolShape shape, uint64_t memory_bytes, const std::string& stage) {
  block_size_ = std::max<int64_t>(1, shape.block_size);
  shape.block_size = block_size_;
  block_bytes_ = shape.block_bytes();
  total_blocks_ = memory_bytes == 0 ? 0 : static_cast<int64_t>(memory_bytes / block_bytes_);
  OMNI_CHECK(memory_bytes == 0 || total_blocks_ > 0, stage, ": kv_cache_memory_bytes (",
             memory_bytes, ") is less than one KV block (", block_bytes_, " bytes at block_size ",
             block_size_, ")");
  // Allocated now, once: sequences take its blocks as they grow and nothing is reallocated or
  // copied after this.
  if (total_blocks_ > 0) {
    shape.num_blocks = total_blocks_;
    pool_ = std::make_shared<models::KvBlockPool>(shape);
  }
}

void KvManager::attach(models::KvCache& cache) const {
  if (pool_) {
    cache.use_pool(pool_);
  } else {
    cache.set_block_size(block_size_);
  }
}

void KvManager::check_fits(int64_t need, int64_t prompt_tokens, int64_t max_new_tokens) const {
  if (need <= total_blocks_) return;
  throw StageError(StageError::Code::kInvalidArgument, "",
                   "the request needs " + std::to_string(need) + " KV blocks (" +
                       std::to_string(prompt_tokens) + " prompt tokens plus " +
                       std::to_string(max_new_tokens) + " new tokens); the KV cache holds " +
                       std::to_string(total_blocks_) +
                       ": ask for fewer tokens or raise kv_cache_memory_bytes");
}

bool KvManager::admit(KvSequence& seq, int64_t prompt_tokens, int64_t max_new_tokens) {
  const int64_t need = seq.cache->blocks_for(prompt_tokens + max_new_tokens);
  if (pool_) {
    check_fits(need, prompt_tokens, max_new_tokens);
    // By the blocks it takes now (its prompt and first token), beside the blocks the running
    // sequences take at their next token; preempted sequences resume before anyone new.
    const int64_t now = seq.cache->blocks_for(prompt_tokens + 1);
    if (waiting_to_resume_ > 0 || free_blocks() < now + next_token_blocks(running_)) {
      ++admission_waits_;
      return false;
    }
  }
  add_running(seq, need, prompt_tokens);
  return true;
}

bool KvManager::admit_worst_case(KvSequence& seq, int64_t prompt_tokens, int64_t max_new_tokens) {
  const int64_t need = seq.cache->blocks_for(prompt_tokens + max_new_tokens);
  if (pool_) {
    check_fits(need, prompt_tokens, max_new_tokens);
    if (total_blocks_ - reserved_ < need) {
      ++admission_waits_;
      return false;
    }
  }
  add_running(seq, need, 0);
  return true;
}

void KvManager::add_running(KvSequence& seq, int64_t need, int64_t prompt_tokens) {
  seq.reserved = need;
  seq.prompt_length = prompt_tokens;
  seq.preempted = false;
  reserved_ += need;
  running_.push_back(&seq);
}

int64_t KvManager::free_blocks() const {
  int64_t promised = 0;
  for (const auto* s : running_) {
    if (s->prompt_length > 0) {
      promised += s->cache->blocks_for(s->prompt_length + 1) - s->cache->blocks();
    }
  }
  return total_blocks_ - pool_->blocks_in_use() - promised;
}

int64_t KvManager::next_token_blocks(const std::vector<KvSequence*>& rows) {
  int64_t n = 0;
  for (const auto* s : rows) {
    if (s->preempted || s->prompt_length > 0) continue;  // a prompt's count in free_blocks
    n += s->cache->blocks_for(s->cache->length() + 1) - s->cache->blocks();
  }
  return n;
}

size_t KvManager::admission_index(const KvSequence* seq) const {
  return static_cast<size_t>(std::find(running_.begin(), running_.end(), seq) - running_.begin());
}

void KvManager::make_room(std::vector<KvSequence*>& rows) {
  if (!pool_) return;
  while (!rows.empty() && next_token_blocks(rows) > free_blocks()) {
    auto victim = std::max_element(rows.begin(), rows.end(), [&](auto* a, auto* b) {
      return admission_index(a) < admission_index(b);
    });
    KvSequence& seq = **victim;
    rows.erase(victim);
    seq.cache->clear();
    seq.preempted = true;
    ++waiting_to_resume_;
    ++preemptions_;
  }
}

bool KvManager::can_resume(const KvSequence& seq, int64_t cached_tokens) const {
  return !pool_ || free_blocks() >= seq.cache->blocks_for(cached_tokens + 1);
}

void KvManager::resumed(KvSequence& seq) {
  if (!seq.preempted) return;
  seq.preempted = false;
  --waiting_to_resume_;
  ++resumed_;
}

void KvManager::release(KvSequence& seq) {
  const auto it = std::find(running_.begin(), running_.end(), &seq);
  if (it == running_.end()) return;  // never admitted
  running_.erase(it);
  reserved_ -= seq.reserved;
  seq.reserved = 0;
  if (seq.preempted) --waiting_to_resume_;
  seq.preempted = false;
  seq.prompt_length = 0;
  reallocations_ += seq.cache->reallocations();
  bytes_copied_ += seq.cache->bytes_copied();
  seq.cache->clear();
}

uint64_t KvManager::release_memory() { return pool_ ? pool_->release_memory() : 0; }

uint64_t KvManager::device_bytes() const {
  if (pool_) return pool_->has_memory() ? pool_->total_bytes() : 0;
  return static_cast<uint64_t>(stats().used) * block_bytes_;
}

uint64_t KvManager::pool_bytes() const {
  return static_cast<uint64_t>(total_blocks_) * block_bytes_;
}

KvStats KvManager::stats() const {
  KvStats s;
  s.block_size = block_size_;
  s.block_bytes = block_bytes_;
  s.total_blocks = total_blocks_;
  s.reserved = reserved_;
  s.pool_bytes = pool_bytes();
  s.reallocations = reallocations_;
  s.bytes_copied = bytes_copied_;
  for (const auto* seq : running_) {
    s.reallocations += seq->cache->reallocations();
    s.bytes_copied += seq->cache->bytes_copied();
    if (!pool_) s.used += seq->cache->blocks_for(seq->cache->length());
  }
  if (pool_) s.used = pool_->blocks_in_use();
  s.preemptions = preemptions_;
  s.resumed = resumed_;
  s.admission_waits = admission_waits_;
  return s;
}

void KvManager::publish() {
  const KvStats now = stats();
  std::lock_guard<std::mutex> lock(published_mutex_);
  published_ = now;
}

KvStats KvManager::published() const {
  std::lock_guard<std::mutex> lock(published_mutex_);
  return published_;
}

}  // namespace omni::pipeline
