// The simulated device: compute on the CPU, "device" memory in separate accounted buffers,
// a worker thread as the copy stream, futures as events. In strict mode (TransferEngineOptions
// ::sim_strict, OMNI_SIM_STRICT=1) it also enforces CUDA's ordering rules (sim_device_rules.h):
// the copy thread poisons destinations and the bytes land when the copy is waited for.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"
#include "sim_device_rules.h"

namespace omni::offload {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Compute scopes entered on this thread (any simulated engine's): strict mode checks that the
// engine's compute calls come from inside one, as they must on CUDA.
thread_local int compute_scope_depth = 0;

class SimComputeScope final : public TransferEngine::ComputeScope {
 public:
  SimComputeScope() { ++compute_scope_depth; }
  ~SimComputeScope() override { --compute_scope_depth; }
};

class CpuSimTransferEngine final : public TransferEngine {
 public:
  explicit CpuSimTransferEngine(const TransferEngineOptions& options)
      : bandwidth_(options.sim_bandwidth_bytes_per_s),
        memory_size_(options.sim_device_memory_bytes),
        pinned_limit_(options.sim_pinned_limit_bytes),
        rules_(sim_strict_enabled(options)
                   ? std::make_shared<sim::Rules>(options.sim_violation_handler)
                   : nullptr),
        worker_([this] { run_copy_stream(); }) {}

  ~CpuSimTransferEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
    // Like destroying a CUDA engine (it synchronizes): every copy has ended and is settled.
    // Buffers and events may outlive the engine; their bytes are in place.
    if (rules_) rules_->settle(last_id_);
  }

  DeviceKind kind() const override { return DeviceKind::kCpuSim; }
  size_t device_memory_bytes() override { return memory_size_; }
  // The "device" is the engine's own buffers: no allocator cache (reserved = allocated), and
  // free is the configured size minus them (0 when the size is unknown).
  DeviceMemoryInfo device_memory() override {
    DeviceMemoryInfo info;
    info.total = memory_size_;
    info.allocator_allocated = info.allocator_reserved = memory_->current();
    info.allocated_peak = info.reserved_peak = memory_->peak();
    info.free =
        memory_size_ > info.allocator_allocated ? memory_size_ - info.allocator_allocated : 0;
    return info;
  }
  c10::Device compute_device() const override { return c10::Device(c10::kCPU); }
  std::string describe() const override {
    return detail::str_cat("cpu (simulated device",
                           bandwidth_ > 0 ? detail::str_cat(", ", bandwidth_ / 1e9, " GB/s") : "",
                           rules_ ? ", strict" : "", ")");
  }

  HostBuffer allocate_host(size_t bytes, bool pin) override {
    // Nothing to pin on the simulated device: the slab is plain aligned memory, reported as
    // pinned when asked for and within sim_pinned_limit_bytes (as cudaHostAlloc would).
    const size_t padded = align_up(std::max<size_t>(bytes, 1), kSlabAlignment);
    auto* data = static_cast<uint8_t*>(std::aligned_alloc(kSlabAlignment, padded));
    OMNI_CHECK(data != nullptr, "out of host memory allocating ", bytes, " bytes");
    bool pinned = false;
    if (pin) {
      const size_t held = pinned_bytes_->fetch_add(bytes) + bytes;
      pinned = pinned_limit_ == 0 || held <= pinned_limit_;
      if (!pinned) pinned_bytes_->fetch_sub(bytes);
    }
    auto counter = pinned ? pinned_bytes_ : nullptr;
    return make_host_buffer(data, bytes, pinned, [counter, bytes](uint8_t* p) {
      std::free(p);
      if (counter) counter->fetch_sub(bytes);
    });
  }

  DeviceBuffer allocate_device(size_t bytes) override {
    at::Tensor memory = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
    if (!rules_) return DeviceBuffer(std::move(memory), memory_);
    // Fresh device memory holds whatever was there before: often, on the CPU, the bytes of
    // the buffer just freed (the same unit's weights, after an evict and reload), which would
    // let a read before the first copy's wait compute the right thing by accident.
    memory.fill_(sim::kPoison);
    return DeviceBuffer(std::move(memory), memory_, rules_->observe_buffer(bytes));
  }

  Event copy_async(const std::vector<CopyOp>& ops, const std::vector<Event>& after,
                   TimeAccumulator* time) override {
    // Every op is checked before any is queued: a rejected copy moves nothing.
    for (const auto& op : ops) {
      OMNI_CHECK(op.src && op.src_offset + op.bytes <= op.src.bytes(),
                 "copy reads past the end of its host buffer (", op.src_offset, " + ", op.bytes,
                 " > ", op.src.bytes(), ")");
      OMNI_CHECK(op.dst && op.dst_offset + op.bytes <= op.dst.bytes(),
                 "copy writes past the end of its device buffer (", op.dst_offset, " + ", op.bytes,
                 " > ", op.dst.bytes(), ")");
    }
    Task task;
    task.after = after;
    if (time) task.time = *time;
    for (const auto& op : ops) task.bytes += op.bytes;
    task.waits = rules_ && std::any_of(after.begin(), after.end(), compute_in_flight);
    std::shared_future<void> done = task.done.get_future().share();
    sim::Rules::Enqueued enqueued;
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (rules_) {
        // Under the queue's lock, so that copy ids follow the queue's order. The destinations
        // read as poison from now on, unless the copy stream has to wait first (for a caller's
        // event standing for compute in flight, or behind a copy that waits for one): that
        // compute may still read them, and the copy thread poisons them once it has waited.
        enqueued = rules_->enqueue(ops, sim::Rules::compute_point_covered(after),
                                   /*poison_now=*/!task.waits && waiting_copies_ == 0);
        if (task.waits) waiting_copies_ += 1;
        task.id = enqueued.id;
      } else {
        // The copy holds the destination's memory, not its handle: dropping the last handle
        // frees (and un-counts) the buffer at once, as on CUDA.
        for (const auto& op : ops) task.parts.push_back(sim::copy_part(op));
        task.id = last_id_ + 1;
      }
      last_id_ = id = task.id;
      queue_.push_back(std::move(task));
      last_copy_ = done;
    }
    wake_.notify_one();
    if (rules_) rules_->report(enqueued.violations);
    return Event(std::make_shared<sim::CopyEvent>(done, id, rules_));
  }

  void compute_wait(const Event& event, TimeAccumulator* stall) override {
    check_in_scope("compute_wait");
    if (event.ready()) {
      event.host_wait();  // surfaces a failed copy
      return;
    }
    const int64_t start = now_ns();
    event.host_wait();
    const int64_t waited = now_ns() - start;
    count_stall(waited);
    if (stall) stall->add(waited);
  }

  // Compute is synchronous on the host thread: when this is called, it has happened. Strict
  // mode numbers the point, so that a copy's `after` can be checked against the binds it
  // must follow.
  Event record_compute() override {
    check_in_scope("record_compute");
    return rules_ ? rules_->record_compute() : Event();
  }

  std::unique_ptr<ComputeScope> enter_compute() override {
    return std::make_unique<SimComputeScope>();
  }

  int64_t begin_compute_timing() override { return now_ns(); }
  void end_compute_timing(int64_t token, TimeAccumulator* time) override {
    if (time) time->add(now_ns() - token);
  }

  void synchronize() override {
    std::shared_future<void> last;
    uint64_t last_id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last = last_copy_;
      last_id = last_id_;
    }
    if (last.valid()) last.wait();
    if (rules_) rules_->settle(last_id);
  }

  void collect_timings() override { synchronize(); }

 private:
  void check_in_scope(const char* call) const {
    if (!rules_ || compute_scope_depth > 0) return;
    DeviceRuleViolation v;
    v.kind = DeviceRuleViolation::Kind::kComputeOutsideScope;
    v.message = detail::str_cat(
        call,
        "() outside a compute scope: run forwards inside OffloadBackend::forward_scope() "
        "(or TransferEngine::enter_compute()); on CUDA the engine's events are on its own "
        "compute stream and kernels queued elsewhere would not wait for their weights");
    rules_->report({v});
  }

  struct Task {
    uint64_t id = 0;
    std::vector<sim::CopyPart> parts;  // relaxed mode: what to write (strict: the rules hold it)
    uint64_t bytes = 0;
    std::vector<Event> after;
    bool waits = false;                   // strict mode: counted in waiting_copies_
    std::optional<TimeAccumulator> time;  // a handle: shares the caller's total
    std::promise<void> done;
  };

  // Whether `e` stands for compute that may still be running: a caller's own event not yet
  // complete. Ours never do: compute events are complete when recorded, and a copy event
  // stands for a copy (which reads no device memory). Never settles a copy.
  static bool compute_in_flight(const Event& e) {
    const Event::Impl* impl = e.impl().get();
    if (impl == nullptr || dynamic_cast<const sim::ComputeEvent*>(impl) ||
        dynamic_cast<const sim::CopyEvent*>(impl)) {
      return false;
    }
    return !impl->ready();
  }

  static void wait_on_copy_stream(const Event& e) {
    if (const auto* copy = dynamic_cast<const sim::CopyEvent*>(e.impl().get())) {
      copy->wait_on_copy_stream();
    } else {
      e.host_wait();
    }
  }

  void run_copy_stream() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        // Like a stream waiting on events: the slot is not overwritten before the compute
        // that read it has finished.
        for (const auto& e : task.after) wait_on_copy_stream(e);
        const auto start = Clock::now();
        if (rules_) {
          rules_->land(task.id);  // poison; the bytes land when the copy is settled
        } else {
          for (const auto& part : task.parts) {
            std::memcpy(part.dst, part.src.data() + part.src_offset, part.bytes);
          }
        }
        end_wait(task);
        if (bandwidth_ > 0) {
          std::this_thread::sleep_until(start + std::chrono::nanoseconds(static_cast<int64_t>(
                                                    1e9 * task.bytes / bandwidth_)));
        }
        const int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        count_copy(task.bytes, ns);
        if (task.time) task.time->add(ns);
        // Drop our references to the buffers before signalling: once the caller sees the
        // copy done it may free the destination, and the memory must be released then, not
        // whenever this thread gets around to it.
        task.parts.clear();
        task.after.clear();
        task.done.set_value();
      } catch (...) {
        if (rules_) rules_->fail(task.id);
        end_wait(task);
        task.parts.clear();
        task.after.clear();
        task.done.set_exception(std::current_exception());
      }
    }
  }

  // Strict mode: this copy no longer holds the poisoning of later ones back.
  void end_wait(Task& task) {
    if (!task.waits) return;
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_copies_ -= 1;
    task.waits = false;
  }

  const double bandwidth_;
  const size_t memory_size_;
  const size_t pinned_limit_;
  std::shared_ptr<std::atomic<size_t>> pinned_bytes_ = std::make_shared<std::atomic<size_t>>(0);
  const std::shared_ptr<sim::Rules> rules_;  // strict mode only
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  std::shared_future<void> last_copy_;
  uint64_t last_id_ = 0;         // of the latest copy queued
  uint64_t waiting_copies_ = 0;  // queued copies that wait for a pending event (strict mode)
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the members it uses exist
};

}  // namespace

std::shared_ptr<TransferEngine> make_cpu_sim_engine(const TransferEngineOptions& options) {
  OMNI_CHECK(options.sim_bandwidth_bytes_per_s >= 0, "bandwidth limit must be >= 0, got ",
             options.sim_bandwidth_bytes_per_s);
  return std::make_shared<CpuSimTransferEngine>(options);
}

}  // namespace omni::offload
