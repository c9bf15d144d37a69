// Offload backends and the one factory that picks them.
//
//   none         every weight resident on the device (the baseline)
//   model-level  component groups in mutual exclusion: DiT(s) vs encoders (VAE resident, or
//                in the exclusion with strict_vae); swaps happen in pre-forward hooks
//   layerwise    a DiT's blocks (or their phases) stream through a ring of device slots:
//                while unit i computes, i+1..i+N are copied; the rest stays resident
//   component    AR models: listed components (visual, audio_tower, ...) come to the device
//                when called; they leave after each forward (sequential), or when another
//                needs the room, least recently used first (alternating)
//
// After apply_offload, run the model on engine->compute_device() as usual, each forward inside
// a backend->forward_scope().
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cpu_offload/disk_tier.h"
#include "cpu_offload/model_spec.h"
#include "cpu_offload/offload_config.h"
#include "cpu_offload/offload_plan.h"
#include "cpu_offload/offload_stats.h"
#include "cpu_offload/transfer_engine.h"

namespace omni::offload {

class OffloadBackend {
 public:
  virtual ~OffloadBackend() = default;
  virtual Strategy strategy() const = 0;
  const OffloadPlan& plan() const { return plan_; }
  TransferEngine& engine() { return *engine_; }

  // Held across one forward (a batch's decode step, a prefill), or one request's forwards:
  // the backend's lock, so that concurrent users cannot rebind each other's weights
  // mid-forward (the serving stages batch requests into one forward instead), and the
  // engine's compute stream (TransferEngine::ComputeScope): on CUDA the
  // engine's events order its copies against that stream, so kernels queued outside a scope
  // would not wait for their weights (the engine refuses such calls; the simulated device's
  // strict mode reports them). Recursive: the same thread may nest scopes.
  class ForwardScope {
   public:
    ForwardScope(std::recursive_mutex& mutex, TransferEngine& engine)
        : lock_(mutex), compute_(engine.enter_compute()) {}

   private:
    std::unique_lock<std::recursive_mutex> lock_;
    std::unique_ptr<TransferEngine::ComputeScope> compute_;
  };
  ForwardScope forward_scope() { return ForwardScope(forward_mutex_, *engine_); }

  // True where no weight moves during a forward (every weight resident): forwards may then run
  // side by side, each in an overlapping_scope() instead of a forward_scope().
  virtual bool forwards_may_overlap() const { return false; }
  // The engine's compute scope without the backend's lock; throws unless
  // forwards_may_overlap().
  std::unique_ptr<TransferEngine::ComputeScope> overlapping_scope();

  // Waits for outstanding copies and compute, then reports.
  virtual OffloadStats stats() = 0;
  // Starts a new measurement (peak device bytes restart from the current holding).
  virtual void reset_stats() = 0;
  // The disk tier's figures, when the backend reads units from the checkpoint's files.
  virtual std::optional<DiskTierStats> disk_stats() { return std::nullopt; }
  // Brings the weights under `path` (a component or group root) to the device now and keeps
  // them bound until the next forward that needs their room, e.g. before a cross-stage
  // hand-off reads a component's parameters directly. Resident weights need nothing.
  virtual void ensure_on_device(const std::string& path) = 0;
  // Moves every offloaded unit that is on the device and not running back to the host, e.g.
  // when a stage pipeline's device ledger asks an idle stage to make room for another stage on
  // the same device. Returns the device bytes freed. Resident weights stay; a backend without
  // such units frees nothing. Not concurrent with a forward (callers serialize them).
  virtual size_t release_device() { return 0; }

 protected:
  OffloadBackend(OffloadPlan plan, std::shared_ptr<TransferEngine> engine)
      : plan_(std::move(plan)), engine_(std::move(engine)) {}
  OffloadPlan plan_;
  std::shared_ptr<TransferEngine> engine_;
  std::recursive_mutex forward_mutex_;
};

// Moves `root`'s weights into the engine's stores and attaches the hooks the strategy needs.
// The module keeps working as before, on engine->compute_device(). Destroying the backend
// detaches the hooks and frees the weights: the module is unusable afterwards.
std::unique_ptr<OffloadBackend> apply_offload(torch::nn::Module& root, const ModelSpec& spec,
                                              const OffloadConfig& config,
                                              std::shared_ptr<TransferEngine> engine);

}  // namespace omni::offload
