// One device-memory budget shared by the stages of a pipeline that sit on the same device.
//
// Co-located stages do not each reserve a share of the card. The ledger knows each stage's
// weight bytes on its device; a stage must hold a grant while it computes, and a grant needs
// room: an idle stage whose weights may leave (offload_stage) is asked to give its memory back
// (Stage::set_device_released), least recently used first, until the incoming stage fits. A
// stage that cannot leave (offload_stage off) holds its bytes for good. Grants are counted, so
// several requests may use a stage at once; a stage in use is never evicted, and a grant that
// must wait for one waits until it is idle.
//
// Why this cannot deadlock: a stage that may leave takes its grant only when its input is
// complete (its upstream finished: Pipeline waits for that on constrained devices), so it never
// waits for another stage while holding one; a stage that stays holds its bytes either way, so
// its grant takes no room from anyone. Every grant is released when its run ends.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "worker/pipeline/stage.h"

namespace omni::pipeline {

class DeviceLedger {
 public:
  struct Member {
    int64_t stage_id = 0;
    Stage* stage = nullptr;
    std::string device;     // stages with the same key share the budget
    uint64_t bytes = 0;     // the stage's bytes on the device when loaded: weights and KV pool
    uint64_t kv_bytes = 0;  // of `bytes`, its KV pool
    bool evictable = false;
  };
  // `budgets`: device key -> bytes (0 or missing: no budget there). Throws omni::Error when a
  // device's fixed stages plus its largest evictable one exceed its budget (nothing could run).
  DeviceLedger(std::vector<Member> members, std::map<std::string, uint64_t> budgets);

  // True when the stage may leave a device whose stages do not all fit its budget at once: it
  // may hold a grant only while it cannot be evicted, so the pipeline runs it after its upstream
  // finished. A stage that stays (its bytes always counted) streams as usual.
  bool constrained(int64_t stage_id) const;

  // Waits for room (evicting idle stages) and marks the stage in use. Throws StageError
  // kCancelled when `cancel` fires while waiting.
  void acquire(int64_t stage_id, const CancelToken& cancel);
  void release(int64_t stage_id);

  // {"<device>": {"budget": n, "held": n, "evictions": n, "stages": {"<name>": {"bytes",
  // "weight_bytes", "kv_bytes", "resident", "in_use", "evictions", "bytes_released"}}}}
  std::string stats_json() const;

 private:
  struct Entry {
    Member member;
    bool resident = false;
    int in_use = 0;
    uint64_t last_use = 0;
    uint64_t evictions = 0;
    uint64_t bytes_released = 0;
  };
  Entry& entry(int64_t stage_id);
  uint64_t held(const std::string& device) const;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, Entry> entries_;
  std::map<std::string, uint64_t> budgets_;
  std::map<std::string, uint64_t> evictions_;
  std::set<std::string> constrained_devices_;
  uint64_t clock_ = 0;
};

}  // namespace omni::pipeline
