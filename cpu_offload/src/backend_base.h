// Shared machinery of the backends: packing units, the resident set, hook attachment and
// the per-unit counters. Internal to the engine.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_offload/disk_tier.h"
#include "cpu_offload/hooks.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/weight_store.h"

namespace omni::offload {

// A hook that forwards to two callbacks: entering and leaving the hooked method.
class CallbackHook final : public ModelHook {
 public:
  CallbackHook(std::function<void()> pre, std::function<void()> post)
      : pre_(std::move(pre)), post_(std::move(post)) {}
  void pre_forward(torch::nn::Module&, const std::string&, HookArgs&) override { pre_(); }
  void post_forward(torch::nn::Module&, const std::string&, c10::IValue&) override { post_(); }
  // A failed forward ends the unit's use just like a finished one.
  void on_forward_error(torch::nn::Module&, const std::string&) override { post_(); }

 private:
  std::function<void()> pre_;
  std::function<void()> post_;
};

struct UnitCounters {
  TimeAccumulator copy;
  TimeAccumulator compute;
  TimeAccumulator stall;
  std::atomic<uint64_t> loads{0};
  std::atomic<uint64_t> sync_loads{0};
};

class BackendBase : public OffloadBackend {
 public:
  ~BackendBase() override;
  OffloadStats stats() override;
  void reset_stats() override;
  // Default: checks the path; the weights under it are resident or streamed on demand.
  void ensure_on_device(const std::string& path) override;

 protected:
  BackendBase(torch::nn::Module& root, OffloadPlan plan, std::shared_ptr<TransferEngine> engine,
              const OffloadConfig& config);

  // Streams the plan's resident tensors to the device through a staging buffer (no host
  // slab) and binds them there.
  void make_resident();
  // Packs one planned unit into its host slab; returns its index in units_.
  // `prefetched`: the backend copies this unit while another computes (layerwise,
  // model-level), so its slab must be pinned unless pin_memory is off (throws otherwise).
  int add_unit(const UnitPlan& plan, bool prefetched = false);
  // The disk tier: the unit laid out but not packed, its tensors let go (they are read from
  // `files` when needed); null when some tensor of it has no place in a file.
  std::unique_ptr<OffloadUnit> disk_unit(const UnitPlan& plan, const TensorFiles& files);
  // Appends a unit made elsewhere (disk_unit); returns its index in units_.
  int push_unit(std::unique_ptr<OffloadUnit> unit);
  // Units whose module is `path`, lies under it, or contains it.
  std::vector<int> units_at(const std::string& path) const;
  // Attaches `hook` to every hookable method of the module at `path`.
  void attach_hook(const std::string& path, const std::shared_ptr<ModelHook>& hook);
  // Device bytes of the resident weights (their slab, padding included).
  size_t resident_device_bytes() const { return resident_ ? resident_->bytes() : 0; }
  // Slot capacity reported as max_unit_bytes.
  virtual size_t max_unit_bytes() const = 0;
  // Waits for every copy and compute in flight; never throws. A backend that owns device
  // buffers calls it first thing in its destructor: its buffers die before BackendBase's
  // destructor runs, and freeing a slot that a copy (a prefetch) still writes into hands the
  // memory to the next allocation on CUDA while the copy goes on.
  void wait_for_device() noexcept;

  torch::nn::Module& root_;
  OffloadConfig config_;
  std::vector<std::unique_ptr<OffloadUnit>> units_;
  std::vector<std::unique_ptr<UnitCounters>> counters_;

 private:
  // The model's tensors by name, read once: packing rebinds their data, never their identity.
  std::unordered_map<std::string, at::Tensor> tensors_;
  std::vector<std::pair<HookableModule*, std::string>> attached_;  // (module, method)
  std::unique_ptr<OffloadUnit> resident_;
  DeviceBuffer resident_buffer_;
};

std::unique_ptr<OffloadBackend> make_resident_backend(torch::nn::Module& root, OffloadPlan plan,
                                                      std::shared_ptr<TransferEngine> engine,
                                                      const OffloadConfig& config);
std::unique_ptr<OffloadBackend> make_layerwise_backend(torch::nn::Module& root, OffloadPlan plan,
                                                       std::shared_ptr<TransferEngine> engine,
                                                       const OffloadConfig& config);
std::unique_ptr<OffloadBackend> make_component_backend(torch::nn::Module& root, OffloadPlan plan,
                                                       std::shared_ptr<TransferEngine> engine,
                                                       const OffloadConfig& config);
std::unique_ptr<OffloadBackend> make_model_level_backend(torch::nn::Module& root, OffloadPlan plan,
                                                         std::shared_ptr<TransferEngine> engine,
                                                         const OffloadConfig& config);

}  // namespace omni::offload
