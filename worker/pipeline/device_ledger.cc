#include "worker/pipeline/device_ledger.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::pipeline {

DeviceLedger::DeviceLedger(std::vector<Member> members, std::map<std::string, uint64_t> budgets)
    : budgets_(std::move(budgets)) {
  std::map<std::string, uint64_t> fixed, largest, total;
  for (auto& m : members) {
    OMNI_CHECK(m.stage != nullptr, "device ledger: stage ", m.stage_id, " has no stage");
    Entry e;
    e.member = m;
    // Fixed stages hold their bytes from the start; evictable ones load on first use.
    e.resident = !m.evictable;
    if (m.evictable) {
      largest[m.device] = std::max(largest[m.device], m.bytes);
    } else {
      fixed[m.device] += m.bytes;
    }
    total[m.device] += m.bytes;
    entries_.emplace(m.stage_id, e);
  }
  for (const auto& [device, budget] : budgets_) {
    if (budget == 0) continue;
    if (fixed[device] + largest[device] > budget) {
      throw omni::Error(omni::detail::str_cat(
          "the device budget of ", budget, " bytes on device '", device,
          "' cannot hold the stages that stay there (", fixed[device],
          " bytes) plus the largest that moves (", largest[device], " bytes)"));
    }
    if (total[device] > budget) constrained_devices_.insert(device);
  }
}

DeviceLedger::Entry& DeviceLedger::entry(int64_t stage_id) {
  const auto it = entries_.find(stage_id);
  OMNI_CHECK(it != entries_.end(), "device ledger: no stage ", stage_id);
  return it->second;
}

bool DeviceLedger::constrained(int64_t stage_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(stage_id);
  return it != entries_.end() && it->second.member.evictable &&
         constrained_devices_.count(it->second.member.device) > 0;
}

uint64_t DeviceLedger::held(const std::string& device) const {
  uint64_t bytes = 0;
  for (const auto& [id, e] : entries_) {
    if (e.member.device == device && e.resident) bytes += e.member.bytes;
  }
  return bytes;
}

void DeviceLedger::acquire(int64_t stage_id, const CancelToken& cancel) {
  std::unique_lock<std::mutex> lock(mutex_);
  Entry& incoming = entry(stage_id);
  const std::string& device = incoming.member.device;
  const auto budget_it = budgets_.find(device);
  const uint64_t budget = budget_it == budgets_.end() ? 0 : budget_it->second;
  while (!incoming.resident && budget > 0 && held(device) + incoming.member.bytes > budget) {
    Entry* lru = nullptr;
    for (auto& [id, e] : entries_) {
      if (e.member.device != device || !e.resident || !e.member.evictable || e.in_use > 0) {
        continue;
      }
      if (!lru || e.last_use < lru->last_use) lru = &e;
    }
    if (!lru) {
      // Every stage holding the room is computing: wait for one to finish.
      if (cancel.cancelled()) {
        throw StageError(StageError::Code::kCancelled, incoming.member.stage->name(),
                         "the request was cancelled while waiting for device memory");
      }
      changed_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    // Marked gone before the call: the stage is idle and no grant can start on it while the
    // lock is held. The call itself waits for the stage's lock in the worker.
    lru->resident = false;
    const uint64_t freed = lru->member.stage->set_device_released(true);
    lru->evictions += 1;
    lru->bytes_released += freed;
    evictions_[device] += 1;
    log_info("device ledger: ", lru->member.stage->name(), " gave back ", freed, " bytes for ",
             incoming.member.stage->name());
  }
  incoming.resident = true;
  incoming.in_use += 1;
  incoming.last_use = ++clock_;
}

void DeviceLedger::release(int64_t stage_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entry(stage_id);
  if (e.in_use > 0) e.in_use -= 1;
  e.last_use = ++clock_;
  changed_.notify_all();
}

std::string DeviceLedger::stats_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [id, e] : entries_) {
    auto& d = out[e.member.device];
    if (d.is_null()) {
      const auto b = budgets_.find(e.member.device);
      d["budget"] = b == budgets_.end() ? 0 : b->second;
      d["held"] = held(e.member.device);
      const auto ev = evictions_.find(e.member.device);
      d["evictions"] = ev == evictions_.end() ? 0 : ev->second;
      d["constrained"] = constrained_devices_.count(e.member.device) > 0;
    }
    d["stages"][e.member.stage->name()] = {
        {"bytes", e.member.bytes},       {"weight_bytes", e.member.bytes - e.member.kv_bytes},
        {"kv_bytes", e.member.kv_bytes}, {"evictable", e.member.evictable},
        {"resident", e.resident},        {"in_use", e.in_use},
        {"evictions", e.evictions},      {"bytes_released", e.bytes_released}};
  }
  return out.dump();
}

}  // namespace omni::pipeline
