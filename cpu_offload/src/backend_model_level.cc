// Model-level offload: component groups in mutual exclusion.
//
// Groups: all encoders together, each DiT alone (several DiTs, such as Wan2.2's transformer
// and transformer_2, exclude each other), and the VAE when strict_vae. A group moves as one
// copy per component into a device slot as large as the largest group. The swap happens in
// the pre-forward hook of a component's root (and of its other hookable methods, such as the
// VAE's decode). With a device budget that holds the resident weights and two groups, a
// second slot lets the group predicted to run next (what followed the current one last time,
// or the pipeline order at first) arrive while the current one computes.
#include <algorithm>

#include "backend_base.h"
#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

class ModelLevelBackend final : public BackendBase {
 public:
  ModelLevelBackend(torch::nn::Module& root, OffloadPlan plan,
                    std::shared_ptr<TransferEngine> engine, const OffloadConfig& config)
      : BackendBase(root, std::move(plan), std::move(engine), config) {
    make_resident();
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      Group group;
      size_t offset = 0;
      for (const auto& unit_plan : plan_.groups[g].units) {
        const int u = add_unit(unit_plan, /*prefetched=*/config_.device_budget_bytes > 0);
        group.units.push_back(u);
        group.offsets.push_back(offset);
        offset = align_up(offset + units_[u]->bytes(), kSlabAlignment);
      }
      group.bytes = offset;
      group.successor = static_cast<int>((g + 1) % plan_.groups.size());
      groups_.push_back(std::move(group));
    }
    // Slots are sized from the slabs (with their alignment padding), not the tensor bytes.
    for (const auto& g : groups_) slot_capacity_ = std::max(slot_capacity_, g.bytes);

    size_t slot_count = 1;
    const size_t resident = resident_device_bytes();
    if (config.device_budget_bytes > 0) {
      OMNI_CHECK(config.device_budget_bytes >= resident + slot_capacity_, "device_budget_bytes ",
                 config.device_budget_bytes,
                 " is below what model-level "
                 "offload needs: resident weights ",
                 resident, " + largest group ", slot_capacity_, " bytes");
      if (groups_.size() > 1 && config.device_budget_bytes >= resident + 2 * slot_capacity_) {
        slot_count = 2;
      } else {
        log_info("model-level offload: device budget ", config.device_budget_bytes,
                 " bytes holds one group only; groups swap without overlap");
      }
    }
    for (size_t s = 0; s < slot_count; ++s) {
      slots_.push_back(Slot{engine_->allocate_device(slot_capacity_), -1, Event(), Event()});
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int index = static_cast<int>(g);
      auto hook = std::make_shared<CallbackHook>([this, index] { enter(index); },
                                                 [this, index] { exit(index); });
      for (int u : groups_[g].units) attach_hook(units_[u]->name(), hook);
    }
  }

  // The slots die with this object, before BackendBase's destructor synchronizes: a copy
  // still in flight (the prefetch issued for the next step or group) would write into freed
  // memory, which CUDA's allocator may already have handed out again.
  ~ModelLevelBackend() override { wait_for_device(); }

  Strategy strategy() const override { return Strategy::kModelLevel; }

  void ensure_on_device(const std::string& path) override {
    auto forward = forward_scope();  // a load is compute-stream work, like a forward's
    BackendBase::ensure_on_device(path);
    for (int u : units_at(path)) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        const auto& units = groups_[g].units;
        if (std::find(units.begin(), units.end(), u) == units.end()) continue;
        // Exactly what a forward would do, without the forward.
        enter(static_cast<int>(g));
        exit(static_cast<int>(g));
      }
    }
  }

 protected:
  size_t max_unit_bytes() const override { return slot_capacity_; }

 private:
  struct Group {
    std::vector<int> units;
    std::vector<size_t> offsets;  // of each unit in the slot
    size_t bytes = 0;
    int slot = -1;  // where it is (or is arriving), -1 when not on the device
    bool bound = false;
    int successor = 0;  // predicted next group
  };
  struct Slot {
    DeviceBuffer buffer;
    int group;
    Event ready;
    Event released;
  };

  void enter(int g) {
    if (depth_ > 0) {
      OMNI_CHECK(active_ == g, "model-level offload: '", plan_.groups[g].name,
                 "' was called while '", plan_.groups[active_].name,
                 "' is running; mutually exclusive groups cannot nest");
      depth_ += 1;
      return;
    }
    active_ = g;
    depth_ = 1;
    Group& group = groups_[g];
    if (group.slot < 0) {
      const int victim = free_slot(g);
      counters_[group.units.front()]->sync_loads += 1;
      load(g, victim);
    }
    Slot& slot = slots_[group.slot];
    if (!group.bound) {
      for (size_t i = 0; i < group.units.size(); ++i) {
        engine_->compute_wait(slot.ready, &counters_[group.units[i]]->stall);
        units_[group.units[i]]->bind(slot.buffer, group.offsets[i]);
      }
      group.bound = true;
    }
    if (last_ >= 0 && last_ != g) groups_[last_].successor = g;
    prefetch(groups_[g].successor, g);
    timing_ = engine_->begin_compute_timing();
  }

  void exit(int g) {
    depth_ -= 1;
    if (depth_ > 0) return;
    engine_->end_compute_timing(timing_, &counters_[groups_[g].units.front()]->compute);
    slots_[groups_[g].slot].released = engine_->record_compute();
    last_ = g;
  }

  void prefetch(int next, int running) {
    if (slots_.size() < 2 || next == running || groups_[next].slot >= 0) return;
    load(next, free_slot(running));
  }

  // The slot to overwrite: one not holding the running group (an empty one first).
  int free_slot(int running) const {
    int fallback = -1;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].group < 0) return static_cast<int>(s);
      if (slots_[s].group != running && fallback < 0) fallback = static_cast<int>(s);
    }
    OMNI_CHECK(fallback >= 0, "model-level offload: no slot to evict");
    return fallback;
  }

  void load(int g, int s) {
    Slot& slot = slots_[s];
    if (slot.group >= 0) evict(slot.group);
    Group& group = groups_[g];
    std::vector<CopyOp> ops;
    for (size_t i = 0; i < group.units.size(); ++i) {
      ops.push_back(units_[group.units[i]]->copy_to(slot.buffer, group.offsets[i]));
      counters_[group.units[i]]->loads += 1;
    }
    slot.ready = engine_->copy_async(ops, {slot.released}, &counters_[group.units.front()]->copy);
    slot.group = g;
    group.slot = s;
  }

  void evict(int g) {
    Group& group = groups_[g];
    for (int u : group.units) units_[u]->unbind();
    group.bound = false;
    slots_[group.slot].group = -1;
    group.slot = -1;
  }

  size_t slot_capacity_ = 0;
  std::vector<Group> groups_;
  std::vector<Slot> slots_;
  int active_ = -1;
  int depth_ = 0;
  int last_ = -1;
  int64_t timing_ = 0;
};

}  // namespace

std::unique_ptr<OffloadBackend> make_model_level_backend(torch::nn::Module& root, OffloadPlan plan,
                                                         std::shared_ptr<TransferEngine> engine,
                                                         const OffloadConfig& config) {
  return std::make_unique<ModelLevelBackend>(root, std::move(plan), std::move(engine), config);
}

}  // namespace omni::offload
