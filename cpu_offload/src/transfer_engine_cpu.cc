// The simulated device: compute on the CPU, "device" memory in separate accounted buffers,
// a worker thread as the copy stream, futures as events.
#include <ATen/ops/empty.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"

namespace omni::offload {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class FutureEvent final : public Event::Impl {
 public:
  explicit FutureEvent(std::shared_future<void> done) : done_(std::move(done)) {}
  bool ready() const override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  void host_wait() const override { done_.get(); }  // rethrows a failed copy

 private:
  std::shared_future<void> done_;
};

class CpuSimTransferEngine final : public TransferEngine {
 public:
  explicit CpuSimTransferEngine(const TransferEngineOptions& options)
      : bandwidth_(options.sim_bandwidth_bytes_per_s),
        memory_size_(options.sim_device_memory_bytes),
        worker_([this] { run_copy_stream(); }) {}

  ~CpuSimTransferEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  DeviceKind kind() const override { return DeviceKind::kCpuSim; }
  size_t device_memory_bytes() override { return memory_size_; }
  c10::Device compute_device() const override { return c10::Device(c10::kCPU); }
  std::string describe() const override {
    return bandwidth_ > 0 ? detail::str_cat("cpu (simulated device, ", bandwidth_ / 1e9, " GB/s)")
                          : std::string("cpu (simulated device)");
  }

  HostBuffer allocate_host(size_t bytes, bool /*pin*/) override {
    // Nothing to pin on the simulated device: the slab is plain aligned memory.
    const size_t padded = align_up(std::max<size_t>(bytes, 1), kSlabAlignment);
    auto* data = static_cast<uint8_t*>(std::aligned_alloc(kSlabAlignment, padded));
    OMNI_CHECK(data != nullptr, "out of host memory allocating ", bytes, " bytes");
    return make_host_buffer(data, bytes, /*pinned=*/false, [](uint8_t* p) { std::free(p); });
  }

  DeviceBuffer allocate_device(size_t bytes) override {
    return DeviceBuffer(at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte)),
                        memory_);
  }

  Event copy_async(const std::vector<CopyOp>& ops, const std::vector<Event>& after,
                   TimeAccumulator* time) override {
    for (const auto& op : ops) {
      OMNI_CHECK(op.src && op.src_offset + op.bytes <= op.src.bytes(),
                 "copy reads past the end "
                 "of its host buffer (",
                 op.src_offset, " + ", op.bytes, " > ", op.src.bytes(), ")");
      OMNI_CHECK(op.dst && op.dst_offset + op.bytes <= op.dst.bytes(),
                 "copy writes past the end "
                 "of its device buffer (",
                 op.dst_offset, " + ", op.bytes, " > ", op.dst.bytes(), ")");
    }
    Task task{ops, after, time, std::promise<void>()};
    std::shared_future<void> done = task.done.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
      last_copy_ = done;
    }
    wake_.notify_one();
    return Event(std::make_shared<FutureEvent>(done));
  }

  void compute_wait(const Event& event, TimeAccumulator* stall) override {
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

  // Compute is synchronous on the host thread: when this is called, it has happened.
  Event record_compute() override { return Event(); }

  int64_t begin_compute_timing() override { return now_ns(); }
  void end_compute_timing(int64_t token, TimeAccumulator* time) override {
    if (time) time->add(now_ns() - token);
  }

  void synchronize() override {
    std::shared_future<void> last;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last = last_copy_;
    }
    if (last.valid()) last.wait();
  }

  void collect_timings() override { synchronize(); }

 private:
  struct Task {
    std::vector<CopyOp> ops;
    std::vector<Event> after;
    TimeAccumulator* time;
    std::promise<void> done;
  };

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
        for (const auto& e : task.after) e.host_wait();
        const auto start = Clock::now();
        uint64_t bytes = 0;
        for (const auto& op : task.ops) {
          std::memcpy(op.dst.data() + op.dst_offset, op.src.data() + op.src_offset, op.bytes);
          bytes += op.bytes;
        }
        if (bandwidth_ > 0) {
          std::this_thread::sleep_until(
              start + std::chrono::nanoseconds(static_cast<int64_t>(1e9 * bytes / bandwidth_)));
        }
        const int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        count_copy(bytes, ns);
        if (task.time) task.time->add(ns);
        // Drop our references to the buffers before signalling: once the caller sees the
        // copy done it may free the destination, and the memory must be released (and
        // un-counted) then, not whenever this thread gets around to it.
        task.ops.clear();
        task.after.clear();
        task.done.set_value();
      } catch (...) {
        task.ops.clear();
        task.after.clear();
        task.done.set_exception(std::current_exception());
      }
    }
  }

  const double bandwidth_;
  const size_t memory_size_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  std::shared_future<void> last_copy_;
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
