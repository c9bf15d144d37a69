// Component offload for autoregressive models (seed: "CPU offloading for transformer models").
//
// Listed components (e.g. the thinker's visual and audio_tower) live in host slabs and come
// to the device when one of their hooked methods is called. Each load allocates a device
// buffer of the component's size; leaving frees it.
//   sequential   a component leaves right after each of its forwards: least memory.
//   alternating  a component stays until another one needs the room. Without a budget, every
//                other offloaded component leaves when one arrives (they alternate); with a
//                budget (bytes, or a fraction of the device), components stay while
//                resident + loaded bytes fit, and the least recently used leave first. That
//                default keeps latency low: nothing moves while everything fits.
// Loads are synchronous (an AR step cannot predict which component comes next, and the
// decoder usually stays resident): they are counted as sync_loads.
#include <algorithm>
#include <limits>

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
      const size_t total = engine_->device_memory_bytes();
      OMNI_CHECK(total > 0, "device_budget_fraction needs a device of known size (",
                 engine_->describe(), " reports none): give device_budget_bytes instead");
      budget_ = static_cast<size_t>(config.device_budget_fraction * static_cast<double>(total));
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
      freed += units_[c]->bytes();
      evict(c);
    }
    return freed;
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
    if (policy_ == ComponentPolicy::kSequential) evict(c);
  }

  void load(int c) {
    make_room(c);
    Component& comp = components_[c];
    comp.buffer = engine_->allocate_device(units_[c]->bytes());
    engine_->compute_wait(
        engine_->copy_async({units_[c]->copy_to(comp.buffer, 0)}, {}, &counters_[c]->copy),
        &counters_[c]->stall);
    units_[c]->bind(comp.buffer, 0);
    counters_[c]->loads += 1;
    counters_[c]->sync_loads += 1;
  }

  void make_room(int incoming) {
    if (budget_ == 0) {
      if (policy_ == ComponentPolicy::kAlternating) {
        for (size_t c = 0; c < components_.size(); ++c) {
          if (static_cast<int>(c) != incoming && components_[c].depth == 0) evict(c);
        }
      }
      return;
    }
    const size_t need = units_[incoming]->bytes();
    while (engine_->memory_counter()->current() + need > budget_) {
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
                "' (least recently used) "
                "to make room for '",
                units_[incoming]->name(), "'");
      evict(lru);
    }
  }

  void evict(size_t c) {
    Component& comp = components_[c];
    if (!comp.buffer) return;
    units_[c]->unbind();
    // The compute stream may still be reading the buffer: it is freed in stream order by
    // the allocator (CUDA), or compute has already finished (simulated device).
    comp.buffer = DeviceBuffer();
  }

  const ComponentPolicy policy_;
  size_t budget_ = 0;
  std::vector<Component> components_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<OffloadBackend> make_component_backend(torch::nn::Module& root, OffloadPlan plan,
                                                       std::shared_ptr<TransferEngine> engine,
                                                       const OffloadConfig& config) {
  return std::make_unique<ComponentBackend>(root, std::move(plan), std::move(engine), config);
}

}  // namespace omni::offload
