// What the in-process stages of every family share: their base class and the helpers between
// steps. Not an API: make_local_stage (local_stages.h) is.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/offload_backend.h"
#include "model_runner/runner/exclusive_forward.h"
#include "worker/pipeline/elapsed.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/stage.h"
#include "worker/runtime/engine_loop.h"
#include "worker/runtime/kv_manager.h"

namespace omni::pipeline::local {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// Between two steps of a stage: stop when the request was cancelled or ran out of time.
void check_going(const StageCall& call, const CancelToken& cancel);
at::Tensor cpu(const at::Tensor& t);
at::Tensor ids_tensor(const std::vector<int64_t>& ids);
std::vector<int64_t> ids_from(const at::Tensor& t);
std::string offload_stats_json(offload::OffloadBackend& backend);
// An engine loop's figures (EngineStats and max_num_seqs) as a stage's "engine" stats.
Json engine_stats(const EngineLoop& loop);
// A KV manager's figures under the names a stage's "engine" stats give them (kv_blocks_used,
// kv_pool_bytes, kv_reallocations, ...).
Json kv_stats(const KvStats& kv);
// offload_stage: every top-level part of the stage is a component, and the budget holds them
// all, so once loaded they stay until the ledger releases them.
models::RunnerOffloadOptions whole_stage_offload(bool pin_memory);

// Runs `fn`, turning the runner's errors into StageErrors: a bad request or checkpoint error
// (omni::Error, c10::Error) is invalid_argument unless it happened mid-generation.
template <typename Fn>
void translate_errors(Fn&& fn) {
  try {
    fn();
  } catch (const StageError&) {
    throw;
  } catch (const c10::Error& e) {
    throw StageError(StageError::Code::kInternal, "", e.what_without_backtrace());
  } catch (const omni::Error& e) {
    throw StageError(StageError::Code::kInvalidArgument, "", e.what());
  } catch (const std::exception& e) {
    throw StageError(StageError::Code::kInternal, "", e.what());
  }
}

// Common parts of the in-process stages: the name, one request at a time (a runner's model and
// offload bindings are shared by its requests), the engine, the stats and the weight bytes.
class LocalStageBase : public Stage {
 public:
  explicit LocalStageBase(const LocalStageOptions& o)
      : name_(o.name), engine_(offload::make_transfer_engine(o.device, o.engine)) {}
  const std::string& name() const override { return name_; }
  // Only between requests: the stage's lock waits for a running one.
  // Leaving the device, a KV pool goes with the weights (no request holds blocks then); both
  // come back with the next request.
  uint64_t set_device_released(bool release) override {
    if (!release) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    return backend().release_device() + (kv_ ? kv_->release_memory() : 0);
  }
  // A KV pool is on the device whole from the start (until the stage leaves it); caches of
  // their own only as they grow.
  uint64_t device_bytes() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return backend().stats().current_device_bytes + extra_device_bytes() +
           (kv_ ? kv_->device_bytes() : 0);
  }
  // Never waits for a running request (a /metrics scrape or the Stats RPC must answer at
  // once): while one runs, the figures taken when the stage was last idle.
  std::string stats_json() override {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    std::lock_guard<std::mutex> snapshot_lock(snapshot_mutex_);
    if (lock.owns_lock()) {
      snapshot_ = idle_stats_json();
    } else if (snapshot_.empty()) {
      return "{\"running\": true}";
    }
    return snapshot_;
  }

 protected:
  virtual offload::OffloadBackend& backend() = 0;
  // A model call of an engine loop's thread: the stage's lock (stats and device release wait
  // for it), the backend's forward scope, no autograd bookkeeping, the runner's errors as
  // StageErrors.
  template <typename Fn>
  void run_model(Fn&& fn) {
    translate_errors([&] {
      c10::InferenceMode inference;
      models::run_exclusive(mutex_, backend(), fn);
    });
  }
  // The stage's figures, taken with mutex_ held (no request running): the offload backend's.
  virtual std::string idle_stats_json() { return offload_stats_json(backend()); }
  // Weight bytes that never come to the device as such (with expert offload: the experts,
  // which only visit the expert cache), and device bytes the stage holds beside its backend's
  // (the expert cache's slots). Measured with mutex_ held.
  virtual uint64_t weight_bytes_kept_off_device() { return 0; }
  virtual uint64_t extra_device_bytes() { return 0; }
  // `info` plus the weight bytes: all of them, those that can leave the device, and those the
  // device ledger accounts for the stage when it is loaded (device_weight_bytes: all weights,
  // less the experts and plus the expert cache under expert offload).
  // (Measured once, when the first info is asked for, and kept: the bytes do not change, and
  // info must not wait for a running request.)
  StageInfo with_bytes(StageInfo info) {
    std::call_once(bytes_measured_, [&] {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto stats = backend().stats();
      param_bytes_ = stats.param_bytes;
      // resident_bytes counts the alignment padding of its buffers, so it can pass param_bytes
      // when every weight is resident.
      offloadable_bytes_ =
          stats.param_bytes > stats.resident_bytes ? stats.param_bytes - stats.resident_bytes : 0;
      device_weight_bytes_ =
          stats.param_bytes - weight_bytes_kept_off_device() + extra_device_bytes();
      device_kv_bytes_ = kv_ ? kv_->pool_bytes() : 0;  // the device ledger's KV line
    });
    info.param_bytes = param_bytes_;
    info.offloadable_bytes = offloadable_bytes_;
    info.device_weight_bytes = device_weight_bytes_;
    info.device_kv_bytes = device_kv_bytes_;
    return info;
  }
  std::once_flag bytes_measured_;
  uint64_t param_bytes_ = 0, offloadable_bytes_ = 0, device_weight_bytes_ = 0, device_kv_bytes_ = 0;
  std::string name_;
  std::shared_ptr<offload::TransferEngine> engine_;
  std::mutex mutex_;
  // The KV caches of a stage that has them (set up by its constructor); under mutex_, but
  // published() from any thread.
  std::unique_ptr<KvManager> kv_;
  std::mutex snapshot_mutex_;
  std::string snapshot_;  // the last stats_json taken between requests
};

}  // namespace omni::pipeline::local
