// Component offload for autoregressive models (seed: "CPU offloading for transformer models").
//
// Listed components (e.g. the thinker's visual and audio_tower) live in host slabs and come
// to the device when one of their hooked methods is called, into a device buffer of their size.
//   sequential   a component leaves right after each of its forwards, and its buffer is freed:
//                least memory (nothing of it stays on the device).
//   alternating  a component stays until another one needs the room. Without a budget, every
//                other offloaded component leaves when one arrives (they alternate); with a
//                budget (bytes, or a fraction of what the device can give), components stay
//                while resident + loaded bytes fit, and the least recently used leave first.
//                That default keeps latency low: nothing moves while everything fits.
// Buffer reuse: a component evicted to make room leaves its buffer as a spare, and the next
// load of its size (or up to 1/kSpareSlack smaller) copies into it instead of allocating: the
// same component coming back, or equal-sized ones taking turns (decoder layers), run with a
// fixed set of buffers and stable addresses. Spares are device bytes held like loaded ones
// (counted, within the budget) and go first when room is needed; without a budget only the
// one the incoming load uses is kept. Loads are synchronous (an AR step cannot predict which
// component comes next, and the decoder usually stays resident): counted as sync_loads.
#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "backend_base.h"
#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

class ComponentBackend final : public BackendBase {
 public:
  ComponentBackend(torch::nn::Module& root, OffloadPlan plan,
                   std::shared_ptr<TransferEngine> engine, const OffloadConfig& config)
      : BackendBase(root, std::move(plan), std::move(engine), config),
        policy_(config.component_policy) {
    make_resident();
    for (const auto& unit_plan : plan_.units) {
      add_unit(unit_plan);
      components_.emplace_back();
    }
    budget_ = config.device_budget_bytes;
    if (budget_ == 0 && config.device_budget_fraction > 0) {
      budget_ = budget_from_fraction(config.device_budget_fraction);
    }
    if (budget_ > 0) {
      for (const auto& unit : units_) {
        OMNI_CHECK(budget_ >= resident_device_bytes() + unit->bytes(), "device budget ", budget_,
                   " bytes cannot hold the resident weights (", resident_device_bytes(),
                   " bytes) and component '", unit->name(), "' (", unit->bytes(), " bytes)");
      }
    }
    for (size_t c = 0; c < units_.size(); ++c) {
      const int index = static_cast<int>(c);
      attach_hook(units_[c]->name(),
                  std::make_shared<CallbackHook>([this, index] { enter(index); },
                                                 [this, index] { exit(index); }));
    }
  }

  // Loads are waited for at once, so no copy is in flight here; waiting anyway keeps the
  // teardown rule of every backend the same: the device is idle before buffers are freed.
  ~ComponentBackend() override { wait_for_device(); }

  Strategy strategy() const override { return Strategy::kComponent; }

  void ensure_on_device(const std::string& path) override {
    auto forward = forward_scope();  // a load is compute-stream work, like a forward's
    BackendBase::ensure_on_device(path);
    for (int c : units_at(path)) {
      if (!components_[c].buffer) load(c);
      components_[c].last_use = ++clock_;
    }
  }

  size_t release_device() override {
    auto forward = forward_scope();
    size_t freed = 0;
    for (size_t c = 0; c < components_.size(); ++c) {
      if (!components_[c].buffer || components_[c].depth > 0) continue;
      freed += components_[c].buffer.bytes();
      evict(c, Leave::kFree);
    }
    for (const auto& spare : spares_) freed += spare.bytes();
    spares_.clear();
    // Freed buffers go to the device allocator's cache, which only this process can use: the
    // room is for another stage, perhaps in another process.
    if (freed > 0) engine_->return_cached_memory();
    return freed;
  }

  OffloadStats stats() override {
    OffloadStats s = BackendBase::stats();
    s.buffer_reuses = buffer_reuses_.load();
    return s;
  }

  void reset_stats() override {
    BackendBase::reset_stats();
    buffer_reuses_ = 0;
  }

 protected:
  size_t max_unit_bytes() const override {
    size_t largest = 0;
    for (const auto& unit : units_) largest = std::max(largest, unit->bytes());
    return largest;
  }

 private:
  struct Component {
    DeviceBuffer buffer;  // set while on the device
    int depth = 0;        // nested calls in flight
    uint64_t last_use = 0;
    int64_t timing = 0;
  };
  // What happens to the buffer of a component that leaves the device.
  enum class Leave { kFree, kSpare };

  // A spare may be this much larger than the load it takes (1/8): close sizes (layers that
  // differ by a norm) share buffers, while a small component never pins a large buffer, which
  // would hold budget that a later load has to evict a component for.
  static constexpr size_t kSpareSlack = 8;

  // The budget for device_budget_fraction: that fraction of what this engine's device bytes
  // could grow to, i.e. what it holds (the resident weights) plus what the device can still
  // give (free memory and the allocator's cached bytes). Memory another stage, process or
  // tensor holds is not ours to plan with; on the simulated device this is fraction x size.
  size_t budget_from_fraction(double fraction) {
    const DeviceMemoryInfo device = engine_->device_memory();
    OMNI_CHECK(device.total > 0, "device_budget_fraction needs a device of known size (",
               engine_->describe(), " reports none): give device_budget_bytes instead");
    const size_t held = engine_->memory_counter()->current();
    const size_t available = device.available();
    const auto budget = static_cast<size_t>(fraction * static_cast<double>(held + available));
    log_info("component offload: device budget ", budget, " bytes = ", fraction, " x (", held,
             " held + ", device.free, " free + ", available - device.free,
             " cached by the allocator) of a ", device.total, "-byte device");
    return budget;
  }

  void enter(int c) {
    Component& comp = components_[c];
    if (comp.depth++ > 0) return;
    if (!comp.buffer) load(c);
    comp.last_use = ++clock_;
    comp.timing = engine_->begin_compute_timing();
  }

  void exit(int c) {
    Component& comp = components_[c];
    if (--comp.depth > 0) return;
    engine_->end_compute_timing(comp.timing, &counters_[c]->compute);
    if (policy_ == ComponentPolicy::kSequential) evict(c, Leave::kFree);
  }

  void load(int c) {
    make_room(c);
    Component& comp = components_[c];
    const int spare = fitting_spare(units_[c]->bytes());
    std::vector<Event> after;
    if (spare >= 0) {
      comp.buffer = std::move(spares_[spare]);
      spares_.erase(spares_.begin() + spare);
      // The previous tenant was unbound when it left, but compute queued before (CUDA) may
      // still read the buffer: the copy waits for everything computed so far. (Its own copy
      // was waited for by compute when it loaded: nothing else writes here.)
      after.push_back(engine_->record_compute());
      buffer_reuses_ += 1;
    } else {
      comp.buffer = engine_->allocate_device(units_[c]->bytes());
    }
    engine_->compute_wait(
        engine_->copy_async({units_[c]->copy_to(comp.buffer, 0)}, after, &counters_[c]->copy),
        &counters_[c]->stall);
    units_[c]->bind(comp.buffer, 0);
    counters_[c]->loads += 1;
    counters_[c]->sync_loads += 1;
  }

  // The smallest spare that holds `bytes` within the slack; -1 when none does.
  int fitting_spare(size_t bytes) const {
    int best = -1;
    for (size_t i = 0; i < spares_.size(); ++i) {
      const size_t size = spares_[i].bytes();
      if (size < bytes || size - bytes > bytes / kSpareSlack) continue;
      if (best < 0 || size < spares_[best].bytes()) best = static_cast<int>(i);
    }
    return best;
  }

  // Frees every spare but `keep` (an index, or -1 for none).
  void free_spares_except(int keep) {
    DeviceBuffer kept = keep >= 0 ? std::move(spares_[keep]) : DeviceBuffer();
    spares_.clear();
    if (kept) spares_.push_back(std::move(kept));
  }

  // Makes room for `incoming`: afterwards a spare fits it, or allocating it stays within the
  // budget (without one: every other idle component has left, alternating).
  void make_room(int incoming) {
    const size_t need = units_[incoming]->bytes();
    if (budget_ == 0) {
      if (policy_ == ComponentPolicy::kAlternating) {
        for (size_t c = 0; c < components_.size(); ++c) {
          if (static_cast<int>(c) != incoming && components_[c].depth == 0) {
            evict(c, Leave::kSpare);
          }
        }
      }
      // One component at a time: only a spare the incoming one can use stays.
      free_spares_except(fitting_spare(need));
      return;
    }
    for (;;) {
      const int spare = fitting_spare(need);
      const size_t grows_by = spare >= 0 ? 0 : need;
      if (engine_->memory_counter()->current() + grows_by <= budget_) return;
      // Spares first: they hold no weights.
      if (spares_.size() > (spare >= 0 ? 1u : 0u)) {
        free_spares_except(spare);
        continue;
      }
      int lru = -1;
      for (size_t c = 0; c < components_.size(); ++c) {
        const auto& comp = components_[c];
        if (static_cast<int>(c) == incoming || !comp.buffer || comp.depth > 0) continue;
        if (lru < 0 || comp.last_use < components_[lru].last_use) lru = static_cast<int>(c);
      }
      OMNI_CHECK(lru >= 0, "component '", units_[incoming]->name(), "' (", need,
                 " bytes) does not fit the device budget of ", budget_,
                 " bytes: the components on the device are all running");
      log_debug("component offload: evicting '", units_[lru]->name(),
                "' (least recently used) to make room for '", units_[incoming]->name(), "'");
      evict(lru, Leave::kSpare);
    }
  }

  void evict(size_t c, Leave leave) {
    Component& comp = components_[c];
    if (!comp.buffer) return;
    units_[c]->unbind();
    // The compute stream may still be reading the buffer: freed, it goes back in stream order
    // through the allocator (CUDA), or compute has already finished (simulated device); kept
    // as a spare, the next copy into it waits for that compute (load).
    if (leave == Leave::kSpare) spares_.push_back(std::move(comp.buffer));
    comp.buffer = DeviceBuffer();
  }

  const ComponentPolicy policy_;
  size_t budget_ = 0;
  std::vector<Component> components_;
  std::vector<DeviceBuffer> spares_;  // buffers evicted components left, for the next loads
  std::atomic<uint64_t> buffer_reuses_{0};
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<OffloadBackend> make_component_backend(torch::nn::Module& root, OffloadPlan plan,
                                                       std::shared_ptr<TransferEngine> engine,
                                                       const OffloadConfig& config) {
  return std::make_unique<ComponentBackend>(root, std::move(plan), std::move(engine), config);
}

}  // namespace omni::offload
