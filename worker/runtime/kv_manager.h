// The KV blocks of one stage's sequences, over model_runner's block pool. With a memory budget
// the pool is allocated once, when the stage starts; a sequence is admitted when the blocks of
// its prompt and first token are free beside what the running ones take at their next token;
// a prompt that runs in chunks has its blocks promised from its admission; and when a step's
// rows need more blocks than are free, the one admitted last is preempted (its blocks go back)
// until the rest fit, to resume later by recomputing what it had cached. Without a budget each
// sequence's cache grows on its own. Not thread-safe (the stage calls it under its own lock),
// except published().
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model_runner/kv/kv_block_pool.h"
#include "model_runner/kv/kv_cache.h"

namespace omni::pipeline {

// A sequence as the KV manager sees it: a stage's own sequence holds one.
struct KvSequence {
  models::KvCache* cache = nullptr;
  // From admission until its prompt has run (prompt_done): the prompt's length, whose blocks
  // and the first token's are promised to it.
  int64_t prompt_length = 0;
  bool preempted = false;  // its blocks went back to the pool; it resumes when they are free
  int64_t reserved = 0;    // its worst case in blocks (prompt plus max_new_tokens): demand
};

struct KvStats {
  int64_t block_size = 0;
  uint64_t block_bytes = 0;
  int64_t total_blocks = 0;  // 0: no pool
  int64_t reserved = 0;      // the running sequences' worst cases
  int64_t used = 0;          // blocks held now
  uint64_t pool_bytes = 0;
  int64_t reallocations = 0;  // growable caches' reallocations (none in a pool)
  uint64_t bytes_copied = 0;  // the history bytes those copied
  int64_t preemptions = 0, resumed = 0;
  // Admissions refused for want of free blocks (a request that waits counts at every try).
  int64_t admission_waits = 0;
};

class KvManager {
 public:
  // `shape`: the stage's keys and values per token, and its block size (num_blocks is set
  // here from `memory_bytes`; 0: no pool). Throws omni::Error naming `stage` when the budget is
  // less than one block.
  KvManager(models::KvPoolShape shape, uint64_t memory_bytes, const std::string& stage);

  bool pooled() const { return pool_ != nullptr; }
  // Sets up a new sequence's cache: in the pool, or growing by blocks of block_size.
  void attach(models::KvCache& cache) const;
  // Admits `seq` with its prompt of `prompt_tokens` and up to `max_new_tokens`: false while
  // the blocks of its prompt and first token are not free, or while a preempted sequence waits
  // to resume. Throws StageError kInvalidArgument when its worst case exceeds the pool.
  bool admit(KvSequence& seq, int64_t prompt_tokens, int64_t max_new_tokens);
  // Admits `seq` only when its worst case (prompt plus max_new_tokens) fits beside the worst
  // cases of those admitted so: it never needs preempting (for a sequence that cannot recompute
  // its history). Throws like admit when the worst case exceeds the pool.
  bool admit_worst_case(KvSequence& seq, int64_t prompt_tokens, int64_t max_new_tokens);
  // Its prompt has run: its blocks are its own now, no longer promised.
  void prompt_done(KvSequence& seq) { seq.prompt_length = 0; }
  // Before a step of `rows`: while they need more blocks at their next token than are free,
  // the one admitted last leaves `rows`, preempted (its cache cleared).
  void make_room(std::vector<KvSequence*>& rows);
  // A preempted sequence with `cached_tokens` to recompute: true when their blocks and its next
  // token's are free; resumed() once it recomputed them.
  bool can_resume(const KvSequence& seq, int64_t cached_tokens) const;
  void resumed(KvSequence& seq);
  // `seq` leaves (finished, cancelled, failed): its cache is cleared, its figures kept.
  void release(KvSequence& seq);
  // The stage leaves the device: the pool's memory goes (no sequence holds blocks then).
  uint64_t release_memory();
  // Device bytes of KV now: the whole pool while it has memory, else the caches' blocks.
  uint64_t device_bytes() const;
  uint64_t pool_bytes() const;  // the pool's size, allocated or not (the device ledger's line)
  KvStats stats() const;
  // Keeps a copy of stats() for published(), which any thread may read: a stage publishes after
  // each change it makes (an admission, a step, a release), so its stats never wait for a step.
  void publish();
  KvStats published() const;

 private:
  int64_t free_blocks() const;  // of the pool, less the blocks promised to prompts
  void check_fits(int64_t need, int64_t prompt_tokens, int64_t max_new_tokens) const;
  void add_running(KvSequence& seq, int64_t need, int64_t prompt_tokens);
  static int64_t next_token_blocks(const std::vector<KvSequence*>& rows);
  size_t admission_index(const KvSequence* seq) const;

  int64_t block_size_ = 16;
  uint64_t block_bytes_ = 0;
  int64_t total_blocks_ = 0;
  std::shared_ptr<models::KvBlockPool> pool_;
  std::vector<KvSequence*> running_;  // admission order
  int64_t waiting_to_resume_ = 0;
  int64_t reserved_ = 0;
  int64_t reallocations_ = 0;  // of the caches already released
  uint64_t bytes_copied_ = 0;
  int64_t preemptions_ = 0, resumed_ = 0;
  int64_t admission_waits_ = 0;
  mutable std::mutex published_mutex_;
  KvStats published_;
};

}  // namespace omni::pipeline
