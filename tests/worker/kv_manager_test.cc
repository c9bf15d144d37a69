// The runtime's KV manager (worker/runtime/kv_manager.h) over a pool of 6 blocks of 4 tokens:
// admission by the blocks a sequence takes now, the blocks of a prompt still running promised
// to it, the sequence admitted last preempted when a step's rows need more than is free, resume
// when its blocks are free again, and every block back at the end. Without a budget, caches grow
// on their own. Admission by the worst case waits instead of preempting.
#include "worker/runtime/kv_manager.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "worker/pipeline/stage.h"

namespace omni::pipeline {
namespace {

models::KvPoolShape shape() {
  models::KvPoolShape s;
  s.num_layers = 1;
  s.kv_heads = 1;
  s.head_dim = 2;
  s.block_size = 4;
  return s;
}

// `tokens` more positions in `cache` (its one layer).
void grow(models::KvCache& cache, int64_t tokens) {
  const auto kv = at::zeros({1, 1, tokens, 2});
  cache.append(0, kv, kv);
}

struct Seq {
  models::KvCache cache{1};
  KvSequence kv;
  Seq() { kv.cache = &cache; }
};

TEST(KvManager, AdmitsByBlocksPromisesPromptsPreemptsTheLastAdmittedAndResumes) {
  KvManager kv(shape(), 6 * shape().block_bytes(), "stage 0 (test)");
  ASSERT_TRUE(kv.pooled());
  Seq a, b, c, huge;
  for (Seq* s : {&a, &b, &c, &huge}) kv.attach(s->cache);
  // Its worst case (27 blocks) is more than the pool: refused as a bad request.
  try {
    kv.admit(huge.kv, 6, 100);
    ADD_FAILURE() << "admitted a request larger than the pool";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
  }
  // a takes 2 blocks for its prompt and first token, b 4: the pool is promised whole before
  // either prompt ran, so c waits.
  ASSERT_TRUE(kv.admit(a.kv, 6, 10));
  ASSERT_TRUE(kv.admit(b.kv, 13, 4));
  EXPECT_FALSE(kv.admit(c.kv, 1, 1));
  grow(a.cache, 6);
  kv.prompt_done(a.kv);
  grow(b.cache, 13);
  kv.prompt_done(b.kv);
  EXPECT_EQ(kv.stats().used, 6);
  EXPECT_EQ(kv.stats().reserved, 4 + 5);
  // a fills its second block: its next token needs a seventh. b, admitted last, leaves the
  // step with its blocks.
  grow(a.cache, 2);
  std::vector<KvSequence*> rows = {&a.kv, &b.kv};
  kv.make_room(rows);
  ASSERT_EQ(rows, std::vector<KvSequence*>{&a.kv});
  EXPECT_TRUE(b.kv.preempted);
  EXPECT_EQ(b.cache.length(), 0);
  EXPECT_EQ(kv.stats().preemptions, 1);
  EXPECT_EQ(kv.stats().used, 2);
  // While b waits to resume, nobody new comes in.
  EXPECT_FALSE(kv.admit(c.kv, 1, 1));
  grow(a.cache, 1);  // a's next token: its third block
  // b's 14 cached tokens and its next one take 4 blocks; 3 are free.
  EXPECT_FALSE(kv.can_resume(b.kv, 14));
  kv.release(a.kv);
  EXPECT_TRUE(kv.can_resume(b.kv, 14));
  grow(b.cache, 14);
  kv.resumed(b.kv);
  EXPECT_FALSE(b.kv.preempted);
  EXPECT_EQ(kv.stats().resumed, 1);
  ASSERT_TRUE(kv.admit(c.kv, 1, 1));
  kv.release(b.kv);
  kv.release(c.kv);
  const KvStats s = kv.stats();
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.reallocations, 0);
  EXPECT_EQ(s.bytes_copied, 0u);
  EXPECT_EQ(s.pool_bytes, 6 * shape().block_bytes());
  // The stage leaves the device: the pool's memory goes, its size stays the ledger's line.
  EXPECT_EQ(kv.release_memory(), 6 * shape().block_bytes());
  EXPECT_EQ(kv.device_bytes(), 0u);
  EXPECT_EQ(kv.pool_bytes(), 6 * shape().block_bytes());
}

TEST(KvManager, WithoutABudgetEachCacheGrowsOnItsOwn) {
  KvManager kv(shape(), 0, "stage 0 (test)");
  EXPECT_FALSE(kv.pooled());
  Seq a;
  kv.attach(a.cache);
  ASSERT_TRUE(kv.admit(a.kv, 1000, 1000));  // no pool: nothing to wait for
  grow(a.cache, 5);
  grow(a.cache, 5);
  EXPECT_EQ(kv.stats().used, 3);  // 10 tokens in blocks of 4
  EXPECT_EQ(kv.device_bytes(), 3 * shape().block_bytes());
  kv.release(a.kv);
  const KvStats s = kv.stats();
  EXPECT_EQ(s.used, 0);
  EXPECT_GE(s.reallocations, 1);  // the second append outgrew the first block run
  EXPECT_GT(s.bytes_copied, 0u);
  EXPECT_EQ(kv.pool_bytes(), 0u);
}

// Admission by the worst case (the talker's): a sequence is admitted only when its prompt and
// every new token fit beside the worst cases of those admitted so, so a step never runs the pool
// dry and nothing is preempted; the one that waits is counted, and admitted once blocks go back.
TEST(KvManager, WorstCaseAdmissionWaitsInsteadOfPreempting) {
  KvManager kv(shape(), 6 * shape().block_bytes(), "stage 1 (test)");
  Seq a, b, huge;
  for (Seq* s : {&a, &b, &huge}) kv.attach(s->cache);
  EXPECT_THROW(kv.admit_worst_case(huge.kv, 20, 8), StageError);  // 7 blocks of 6
  ASSERT_TRUE(kv.admit_worst_case(a.kv, 6, 6));                   // 3 blocks
  EXPECT_FALSE(kv.admit_worst_case(b.kv, 9, 6));                  // 4 more: only 3 left
  EXPECT_EQ(kv.stats().admission_waits, 1);
  grow(a.cache, 12);  // its whole worst case: still no room for b, and no preemption
  std::vector<KvSequence*> rows = {&a.kv};
  kv.make_room(rows);
  EXPECT_EQ(rows.size(), 1u);
  EXPECT_EQ(kv.stats().preemptions, 0);
  kv.release(a.kv);
  EXPECT_TRUE(kv.admit_worst_case(b.kv, 9, 6));
  EXPECT_EQ(kv.stats().reserved, 4);
  kv.release(b.kv);
  EXPECT_EQ(kv.stats().used, 0);
}

}  // namespace
}  // namespace omni::pipeline
