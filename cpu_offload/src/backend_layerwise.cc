// Layerwise offload: a DiT's blocks (or phases) stream through a ring of device slots.
//
// Units form cyclic execution orders (one per DiT). There are N+1 slots (N =
// num_gpu_layers), each as large as the largest unit. When unit i starts, it waits for its
// own copy (on the device, not the host), and the copies of the next N units of its order
// are issued, each into a slot whose previous unit has finished computing (the copy stream
// waits for that compute's event). The last unit of an order prefetches the first ones for
// the next step. A unit that runs while not on the device (out of the expected order) is
// loaded synchronously: it never computes with missing weights. Under a host memory budget
// the units may stay on disk (disk_tier.h): a load then copies from the tier's host entry, and
// the units after the window are read ahead.
#include <algorithm>

#include "backend_base.h"
#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

class LayerwiseBackend final : public BackendBase {
 public:
  LayerwiseBackend(torch::nn::Module& root, OffloadPlan plan,
                   std::shared_ptr<TransferEngine> engine, const OffloadConfig& config)
      : BackendBase(root, std::move(plan), std::move(engine), config),
        window_(config.num_gpu_layers) {
    make_resident();
    const HostPlacement host = place_on_host(plan_, config_);
    if (host.units_on_disk) {
      DiskTierOptions options;
      options.cache_bytes = host.unit_cache_bytes;
      options.min_entries = static_cast<size_t>(window_) + 1;
      options.reader_threads = config_.disk_reader_threads;
      options.pin = config_.pin_memory;
      options.label = "layerwise disk tier";
      options.read = config_.disk_read;
      disk_ = std::make_unique<DiskTier>(engine_, options);
    }
    for (const auto& unit_plan : plan_.units) {
      std::unique_ptr<OffloadUnit> on_disk;
      if (disk_) on_disk = disk_unit(unit_plan, config_.disk_files);
      const int u =
          on_disk ? push_unit(std::move(on_disk)) : add_unit(unit_plan, /*prefetched=*/true);
      disk_id_.push_back(units_[u]->host() ? -1 : disk_->add(*units_[u], config_.disk_files));
      const int group = unit_plan.order_group;
      if (static_cast<int>(orders_.size()) <= group) orders_.resize(group + 1);
      position_.push_back(static_cast<int>(orders_[group].size()));
      group_of_.push_back(group);
      orders_[group].push_back(u);
      slot_capacity_ = std::max(slot_capacity_, units_[u]->bytes());
    }
    if (disk_) disk_->prepare();  // pinned entries now, not in the first forward
    unit_slot_.assign(units_.size(), -1);
    timing_.assign(units_.size(), 0);
    active_.assign(units_.size(), 0);
    const size_t slot_count = std::min(units_.size(), static_cast<size_t>(window_) + 1);
    for (size_t s = 0; s < slot_count; ++s) {
      slots_.push_back(Slot{engine_->allocate_device(slot_capacity_), -1, Event(), Event()});
    }
    // Start the first units of each order on their way, so the first step does not wait
    // for a synchronous load.
    for (const auto& order : orders_) {
      for (size_t i = 0; i < order.size() && i < slots_.size(); ++i) {
        const int victim = pick_victim(-1, /*lookahead=*/false);
        if (victim < 0 || slots_[victim].unit >= 0) break;
        load(order[i], victim);
      }
    }
    for (size_t u = 0; u < units_.size(); ++u) {
      const int index = static_cast<int>(u);
      attach_hook(units_[u]->name(),
                  std::make_shared<CallbackHook>([this, index] { enter(index); },
                                                 [this, index] { exit(index); }));
    }
    log_debug("layerwise offload: ", units_.size(), " units, ", slots_.size(), " slots of ",
              slot_capacity_, " bytes, resident ", plan_.resident_bytes, " bytes");
  }

  // The slots die with this object, before BackendBase's destructor synchronizes: a copy
  // still in flight (the prefetch issued for the next step or group) would write into freed
  // memory, which CUDA's allocator may already have handed out again.
  ~LayerwiseBackend() override { wait_for_device(); }

  Strategy strategy() const override { return Strategy::kLayerwise; }
  std::optional<DiskTierStats> disk_stats() override {
    if (!disk_) return std::nullopt;
    return disk_->stats();
  }
  void reset_stats() override {
    BackendBase::reset_stats();
    if (disk_) disk_->reset_stats();
  }

 protected:
  size_t max_unit_bytes() const override { return slot_capacity_; }

 private:
  struct Slot {
    DeviceBuffer buffer;
    int unit;        // the unit held or arriving; -1 when empty
    Event ready;     // its copy has finished
    Event released;  // the compute that last read it has finished
  };

  void enter(int u) {
    active_[u] += 1;
    try {
      bring_in(u);
    } catch (...) {
      // A failed load (a disk read that failed) must not leave the unit counted as running:
      // its slot would stay protected and it would never be unbound. Hooks only unwind the
      // units whose entry finished.
      active_[u] -= 1;
      if (active_[u] == 0 && units_[u]->bound()) {
        if (unit_slot_[u] >= 0) slots_[unit_slot_[u]].released = engine_->record_compute();
        units_[u]->unbind();
      }
      throw;
    }
  }

  void bring_in(int u) {
    if (unit_slot_[u] < 0) {
      const int victim = pick_victim(u, /*lookahead=*/false);
      OMNI_CHECK(victim >= 0, "layerwise offload: no free slot to load '", units_[u]->name(), "' (",
                 slots_.size(), " slots, all in use by running units)");
      counters_[u]->sync_loads += 1;
      log_debug("layerwise: '", units_[u]->name(),
                "' ran out of the expected order: loading it "
                "synchronously");
      load(u, victim);
    }
    Slot& slot = slots_[unit_slot_[u]];
    engine_->compute_wait(slot.ready, &counters_[u]->stall);
    units_[u]->bind(slot.buffer, 0);
    prefetch_after(u);
    timing_[u] = engine_->begin_compute_timing();
  }

  void exit(int u) {
    engine_->end_compute_timing(timing_[u], &counters_[u]->compute);
    active_[u] -= 1;
    if (active_[u] > 0) return;  // a re-entrant call of the same unit is still running
    slots_[unit_slot_[u]].released = engine_->record_compute();
    units_[u]->unbind();
  }

  void prefetch_after(int u) {
    const auto& order = orders_[group_of_[u]];
    const int count = static_cast<int>(order.size());
    const int ahead = std::min(window_, count - 1);
    for (int j = 1; j <= ahead; ++j) {
      const int v = order[(position_[u] + j) % count];
      if (unit_slot_[v] >= 0) continue;
      const int victim = pick_victim(u, /*lookahead=*/true);
      if (victim < 0) return;
      load(v, victim);
    }
    // The disk tier reads the units after the window, so that their bytes are in host memory
    // by the time they are copied.
    if (!disk_) return;
    for (int j = ahead + 1; j <= ahead + config_.disk_read_ahead && j < count; ++j) {
      const int v = order[(position_[u] + j) % count];
      if (unit_slot_[v] < 0 && disk_id_[v] >= 0) disk_->read_ahead(disk_id_[v]);
    }
  }

  // A slot that may be overwritten: empty, or holding a unit that is not running and (for
  // prefetches) not among the next N of the running unit's order.
  int pick_victim(int running, bool lookahead) const {
    auto is_protected = [&](int unit) {
      if (unit == running || active_[unit] > 0) return true;
      if (running < 0 || !lookahead || group_of_[unit] != group_of_[running]) return false;
      const int count = static_cast<int>(orders_[group_of_[running]].size());
      const int distance = (position_[unit] - position_[running] + count) % count;
      return distance <= window_;
    };
    int fallback = -1;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].unit < 0) return static_cast<int>(s);
      if (fallback < 0 && !is_protected(slots_[s].unit)) fallback = static_cast<int>(s);
    }
    return fallback;
  }

  void load(int u, int s) {
    Slot& slot = slots_[s];
    if (slot.unit >= 0) unit_slot_[slot.unit] = -1;
    slot.unit = -1;
    if (disk_id_[u] < 0) {
      slot.ready = engine_->copy_async({units_[u]->copy_to(slot.buffer, 0)}, {slot.released},
                                       &counters_[u]->copy);
    } else {
      // From the disk tier's host entry (read now unless read ahead), which is not refilled
      // until this copy is over; or with mmap reads, from the file's mapping.
      const auto ops = disk_->copy_ops(disk_id_[u], slot.buffer, 0);
      Event ready;
      try {
        ready = engine_->copy_async(ops, {slot.released}, &counters_[u]->copy);
      } catch (...) {
        disk_->release(disk_id_[u], Event());
        throw;
      }
      disk_->release(disk_id_[u], ready);
      slot.ready = ready;
    }
    slot.unit = u;
    unit_slot_[u] = s;
    counters_[u]->loads += 1;
  }

  const int window_;
  size_t slot_capacity_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> orders_;  // per order group: units in execution order
  std::vector<int> position_;             // unit -> index in its order
  std::vector<int> group_of_;             // unit -> order group
  std::vector<int> unit_slot_;            // unit -> slot, -1 when not on the device
  std::vector<int64_t> timing_;
  std::vector<int> active_;
  std::unique_ptr<DiskTier> disk_;  // when the host budget sends the units to disk
  std::vector<int> disk_id_;        // unit -> its id in disk_, -1 when packed on the host
};

}  // namespace

std::unique_ptr<OffloadBackend> make_layerwise_backend(torch::nn::Module& root, OffloadPlan plan,
                                                       std::shared_ptr<TransferEngine> engine,
                                                       const OffloadConfig& config) {
  return std::make_unique<LayerwiseBackend>(root, std::move(plan), std::move(engine), config);
}

}  // namespace omni::offload
