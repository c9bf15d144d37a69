// Moves weight bytes from host memory to the compute device, asynchronously.
//
// One interface, two implementations chosen at run time:
//   cuda  a high-priority copy stream, CUDA events, exact-size pinned host memory;
//   cpu   a simulated device: compute runs on the CPU, device memory is separate accounted
//         buffers, the copy stream is a worker thread and events are futures. It runs the
//         same schedulers as CUDA, so ordering, overlap and memory bounds are tested for real
//         without a GPU (and under ThreadSanitizer). In strict mode it also enforces CUDA's
//         ordering rules, which the CPU would forgive (TransferEngineOptions::sim_strict).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace omni::offload {

enum class DeviceKind { kCpuSim, kCuda };
DeviceKind parse_device_kind(const std::string& text);  // "auto" | "cpu" | "cuda"
// "auto" as "cuda" when this build has the CUDA engine and a CUDA device is usable, else "cpu"
// (the simulated device), with `why` saying which held; any other name unchanged.
std::string resolve_device(const std::string& name, std::string* why = nullptr);
std::string to_string(DeviceKind kind);

// Host memory that holds the master copy of weights. Exact size (no power-of-two rounding);
// pinned when asked and possible.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::shared_ptr<uint8_t> data, size_t bytes, bool pinned)
      : data_(std::move(data)), bytes_(bytes), pinned_(pinned) {}
  uint8_t* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  std::shared_ptr<uint8_t> data_;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

// Counts bytes that the engine holds (current and peak) and the allocations made.
class DeviceMemoryCounter {
 public:
  void add(size_t bytes);
  void remove(size_t bytes);
  size_t current() const { return current_.load(); }
  size_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  // Allocations counted since the engine was made (never reset): what buffer reuse saves.
  uint64_t allocations() const { return allocations_.load(); }

 private:
  std::atomic<size_t> current_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<uint64_t> allocations_{0};
};

// The device's memory as the engine sees it. A budget derived from it starts from what the
// device can still give (free + the allocator's cached bytes), not from its total: another
// stage, process or the activations may hold the rest.
struct DeviceMemoryInfo {
  size_t total = 0;  // the device's size; 0 when unknown (the simulated device without one)
  size_t free = 0;   // not reserved by anyone (CUDA: cudaMemGetInfo; sim: total - allocated)
  // The device allocator: bytes it reserved from the device and bytes handed out of those
  // (CUDA's caching allocator, all our buffers and every tensor; the simulated device has no
  // cache, so both are the engine's own device bytes), with their peaks since the last
  // reset_counters().
  size_t allocator_reserved = 0;
  size_t allocator_allocated = 0;
  size_t reserved_peak = 0;
  size_t allocated_peak = 0;
  // What a new allocation can get: free memory plus what the allocator holds unused.
  size_t available() const {
    return free + (allocator_reserved > allocator_allocated
                       ? allocator_reserved - allocator_allocated
                       : 0);
  }
};

// Device memory owned by the engine: a byte tensor on the compute device (a separate CPU
// allocation for the simulated device). Freed, and un-counted, with its last handle: from then
// on the engine may hand the memory to someone else.
class DeviceBuffer {
 public:
  // What an engine wants to know about the use of its buffers beyond copies. The simulated
  // device's strict mode checks CUDA's ordering rules with it (src/sim_device_rules.h); the
  // CUDA engine attaches none.
  class Observer {
   public:
    virtual ~Observer() = default;
    // Compute starts reading [offset, offset + bytes): a unit's parameters became views of it.
    virtual void on_bind(size_t offset, size_t bytes) = 0;
    // The views of that range are gone (compute that was queued may still be reading).
    virtual void on_unbind(size_t offset, size_t bytes) = 0;
    // The last handle is being dropped. Must not throw.
    virtual void on_free() = 0;
  };

  DeviceBuffer() = default;
  DeviceBuffer(at::Tensor bytes, std::shared_ptr<DeviceMemoryCounter> counter,
               std::shared_ptr<Observer> observer = nullptr);
  const at::Tensor& bytes_tensor() const { return state_->bytes; }
  uint8_t* data() const;
  size_t bytes() const { return state_ ? static_cast<size_t>(state_->bytes.numel()) : 0; }
  explicit operator bool() const { return state_ != nullptr; }
  // Null when the engine observes nothing (CUDA, the relaxed simulated device).
  std::shared_ptr<Observer> observer() const { return state_ ? state_->observer : nullptr; }

 private:
  struct State {
    at::Tensor bytes;
    std::shared_ptr<DeviceMemoryCounter> counter;
    std::shared_ptr<Observer> observer;
    ~State();
  };
  std::shared_ptr<State> state_;
};

// A point on a stream. Events are cheap handles; a default Event is already complete.
class Event {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool ready() const = 0;
    virtual void host_wait() const = 0;
  };
  Event() = default;
  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool ready() const { return !impl_ || impl_->ready(); }
  void host_wait() const {
    if (impl_) impl_->host_wait();
  }
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// One host→device copy.
struct CopyOp {
  HostBuffer src;
  size_t src_offset = 0;
  DeviceBuffer dst;
  size_t dst_offset = 0;
  size_t bytes = 0;
};

// A time total a caller hands to the engine, which adds to it when the timed work has
// finished (CUDA: when its events are found complete, at the latest at collect_timings()).
// A handle: copies share one total. The engine keeps a copy, never a pointer, so a pending
// timing outlives nothing: the backend that owns the total may be gone by then.
class TimeAccumulator {
 public:
  void add(int64_t ns) const {
    state_->total_ns += ns;
    state_->count += 1;
  }
  double total_ms() const { return static_cast<double>(state_->total_ns.load()) / 1e6; }
  int64_t count() const { return state_->count.load(); }
  void reset() const {
    state_->total_ns = 0;
    state_->count = 0;
  }

 private:
  struct State {
    std::atomic<int64_t> total_ns{0};
    std::atomic<int64_t> count{0};
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

struct TransferCounters {
  uint64_t bytes_h2d = 0;
  uint64_t copies = 0;
  double copy_ms = 0;   // time the copy stream spent copying
  double stall_ms = 0;  // time compute waited for copies
  // CUDA with timing on: timings given up because more than kMaxPendingTimings were waiting
  // for their events (nobody collected them); their time is missing from the totals.
  uint64_t timings_dropped = 0;
  // Times the engine gave the device allocator's cached memory back (return_cached_memory).
  uint64_t cache_returns = 0;
};

// A use of device memory that is a bug on CUDA, found by the simulated device's strict mode
// (the rules, and why they are CUDA's: cpu_offload/src/sim_device_rules.h).
struct DeviceRuleViolation {
  enum class Kind {
    // A buffer's last handle was dropped while a copy into it was pending: neither waited for
    // by compute nor observed by the host. On CUDA the allocator hands the memory to the next
    // allocation while the copy still writes into it.
    kFreedWhileCopyPending,
    // A range was bound as parameters (compute reads it) before compute waited for the copy
    // into it: compute reads whatever the copy has not written yet.
    kBoundBeforeCopyWaited,
    // A copy was enqueued into a range still bound as parameters: compute may read it while
    // the copy overwrites it.
    kCopyIntoBoundRange,
    // A copy into a range that compute read (bound since the previous copy) does not name, in
    // `after`, an event recorded after that compute: the copy may overwrite it mid-read.
    kCopyNotOrderedAfterReaders,
    // compute_wait or record_compute outside a ComputeScope (OffloadBackend::forward_scope):
    // on CUDA the engine's events are on its own compute stream, and kernels the caller
    // queues on another stream would not wait for the copies.
    kComputeOutsideScope,
  };
  Kind kind = Kind::kFreedWhileCopyPending;
  size_t buffer_bytes = 0;  // size of the device buffer concerned
  size_t offset = 0;        // the range concerned in it
  size_t bytes = 0;
  uint64_t copy_id = 0;  // the copy concerned (numbered from 1 in submission order)
  std::string message;   // all of the above in words
};
std::string to_string(DeviceRuleViolation::Kind kind);
using DeviceRuleViolationHandler = std::function<void(const DeviceRuleViolation&)>;

struct TransferEngineOptions {
  // Simulated device only: throttle copies to this many bytes per second (0: memcpy speed).
  double sim_bandwidth_bytes_per_s = 0;
  // Simulated device only: pinned host memory it can give (0: no limit). A pin request beyond
  // it gets pageable memory, as cudaHostAlloc failing would (for tests of that path).
  size_t sim_pinned_limit_bytes = 0;
  // Simulated device only: the memory size it reports (0: unknown).
  size_t sim_device_memory_bytes = 0;
  // Simulated device only: enforce CUDA's ordering rules instead of forgiving what the CPU
  // happens to tolerate (cpu_offload/src/sim_device_rules.h). Violations (DeviceRuleViolation)
  // are reported, and a copy's bytes land only when someone waits for it: until then its
  // destination reads as 0xFF (NaN), so compute that reads too early computes garbage,
  // deterministically. Costs a memset per copy and moves the memcpy to the thread that waits
  // (offload-bench small, 2-core VM: layerwise steps 29% longer, model-level 2%); copy_ms and
  // h2d figures then time the poisoning, so measure in relaxed mode. Unset: the environment
  // variable OMNI_SIM_STRICT (1 on, 0 off), else off. The engine test suites turn it on.
  std::optional<bool> sim_strict;
  // Strict mode: called once per violation, on the thread that made it (for a free: the one
  // that dropped the last handle). Unset: the violation is logged and the process aborts.
  DeviceRuleViolationHandler sim_violation_handler;
  int cuda_device_index = 0;
  // CUDA: time copies, stalls and compute with events (copy_ms, stall_ms, the units'
  // compute_ms). Off by default: each timing costs two events and a query. Unset: the
  // environment variable OMNI_CUDA_TIMING (1 on). The simulated device always times (clocks).
  std::optional<bool> cuda_timing;
};
// Whether a CUDA engine made with `options` times its work.
bool cuda_timing_enabled(const TransferEngineOptions& options);
// CUDA: timings waiting for their events beyond this many are dropped (counted), so a process
// that never asks for stats holds a bounded number of events.
constexpr size_t kMaxPendingTimings = 4096;
// Whether a simulated device made with `options` runs in strict mode.
bool sim_strict_enabled(const TransferEngineOptions& options);

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;

  virtual DeviceKind kind() const = 0;
  virtual c10::Device compute_device() const = 0;
  virtual std::string describe() const = 0;

  // Host memory of exactly `bytes`. With pin=true and pinning impossible, falls back to
  // pageable memory and logs a warning once.
  virtual HostBuffer allocate_host(size_t bytes, bool pin) = 0;
  // Device memory, counted in memory_counter().
  virtual DeviceBuffer allocate_device(size_t bytes) = 0;

  // Enqueues `ops` on the copy stream after every event in `after` (e.g. the compute that
  // last read the destination). Returns the event that marks their completion. `time`, when
  // given, receives the copy duration.
  virtual Event copy_async(const std::vector<CopyOp>& ops, const std::vector<Event>& after,
                           TimeAccumulator* time = nullptr) = 0;
  // Makes compute wait for `event` without blocking the host where the device allows it
  // (CUDA). Time compute stalls is added to `stall` and to the counters.
  virtual void compute_wait(const Event& event, TimeAccumulator* stall = nullptr) = 0;
  // An event at the current point of the compute stream.
  virtual Event record_compute() = 0;

  // The compute stream is the engine's own: a forward runs inside a ComputeScope, which makes
  // the calling thread's device work go to that stream until it ends (CUDA: a stream from the
  // pool, ordered after the work the caller had queued on its current stream when the scope
  // began, and the caller's stream ordered after the forward when it ends). The engine's
  // events (record_compute, compute_wait) are on that stream, so they order copies against
  // exactly the forward's kernels, whatever stream the caller had current. The simulated
  // device computes on the calling thread: its scope does nothing. Scopes nest.
  class ComputeScope {
   public:
    virtual ~ComputeScope() = default;
  };
  virtual std::unique_ptr<ComputeScope> enter_compute() { return std::make_unique<ComputeScope>(); }

  // Compute timing: begin returns a token; end adds the elapsed compute time to `time`.
  virtual int64_t begin_compute_timing() = 0;
  virtual void end_compute_timing(int64_t token, TimeAccumulator* time) = 0;

  // Waits for every copy and every compute submitted so far.
  virtual void synchronize() = 0;
  // The engine keeps a copy's host sources until it sees the copy finish (at its next copy or
  // synchronize). A caller that waited for its copies and drops their buffers calls this to
  // have them freed now rather than at the next copy.
  virtual void release_finished_copies() {}
  // Synchronizes, then resolves pending timings into their accumulators (CUDA resolves those
  // whose events are complete along the way too, without waiting).
  virtual void collect_timings() = 0;

  // Total memory of the device; 0 when unknown (the simulated device without a size).
  virtual size_t device_memory_bytes() { return 0; }
  // Peak bytes of the device allocator (weights and activations) since the last
  // reset_counters(); 0 where there is no such allocator (the simulated device).
  virtual size_t allocator_peak_bytes() { return 0; }
  // Free device memory and the allocator's figures, now.
  virtual DeviceMemoryInfo device_memory() = 0;

  // Gives the device memory the allocator keeps cached but unused back to the device, once the
  // work in flight is over. CUDA's caching allocator keeps the blocks this process frees for
  // its own next allocations: memory an idle stage releases for another stage
  // (OffloadBackend::release_device) would otherwise stay taken for every other process on
  // the card, and a stage in another worker process would run out of memory. Returns the
  // bytes given back (the simulated device caches nothing: 0). Counted in counters().
  size_t return_cached_memory();

  TransferCounters counters();
  // Restarts the counters and every peak (device, host, allocator).
  virtual void reset_counters();
  // Device bytes the engine holds (slots, resident weights).
  const std::shared_ptr<DeviceMemoryCounter>& memory_counter() const { return memory_; }
  // Host bytes held in buffers from allocate_host, pinned or pageable (the weights' master
  // copies, staging buffers); its peak is the host peak of loading and running.
  const std::shared_ptr<DeviceMemoryCounter>& host_counter() const { return host_; }

 protected:
  // The engine's part of return_cached_memory().
  virtual size_t release_allocator_cache() { return 0; }
  void count_copy(uint64_t bytes, int64_t ns);
  void count_stall(int64_t ns);

  // Wraps `data` (freed by `free_fn`) as a HostBuffer counted in host_counter().
  HostBuffer make_host_buffer(uint8_t* data, size_t bytes, bool pinned,
                              std::function<void(uint8_t*)> free_fn);

  std::shared_ptr<DeviceMemoryCounter> memory_ = std::make_shared<DeviceMemoryCounter>();
  std::shared_ptr<DeviceMemoryCounter> host_ = std::make_shared<DeviceMemoryCounter>();
  std::atomic<uint64_t> bytes_h2d_{0};
  std::atomic<uint64_t> copies_{0};
  std::atomic<int64_t> copy_ns_{0};
  std::atomic<int64_t> stall_ns_{0};
  std::atomic<uint64_t> timings_dropped_{0};
  std::atomic<uint64_t> cache_returns_{0};
};

// The engine for `kind`. Throws when CUDA is asked for but not built in or not available.
std::shared_ptr<TransferEngine> make_transfer_engine(DeviceKind kind,
                                                     const TransferEngineOptions& options = {});
std::shared_ptr<TransferEngine> make_cpu_sim_engine(const TransferEngineOptions& options);
std::shared_ptr<TransferEngine> make_cuda_engine(const TransferEngineOptions& options);
bool cuda_engine_built();
// CUDA devices this process can use; 0 without the CUDA engine.
int cuda_device_count();

// Byte alignment of slabs and of each tensor inside one.
constexpr size_t kSlabAlignment = 256;
// 256 for tensors too: cuBLASLt picks its algorithms by the operands' pointer alignment (up to
// 256 B), so a weight at a less aligned address than the caching allocator's (512 B) may take
// another kernel than the same weight resident, and outputs would no longer be bitwise equal.
constexpr size_t kTensorAlignment = 256;
inline size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace omni::offload
