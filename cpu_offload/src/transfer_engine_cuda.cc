// The CUDA transfer engine: a high-priority copy stream and a compute stream of its own, events
// between them (compute waits on the GPU, the host never blocks), exact-size pinned host
// memory from cudaHostAlloc. LibTorch's caching host allocator rounds every block up to a
// power of two, which can double the host memory a model needs, so we do not use it. Timing
// (opt-in) uses pooled events, resolved as they complete, at most kMaxPendingTimings waiting.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/transfer_engine.h"

#define OMNI_CUDA_CHECK(expr)                                                       \
  do {                                                                              \
    const cudaError_t omni_err = (expr);                                            \
    OMNI_CHECK(omni_err == cudaSuccess, #expr, ": ", cudaGetErrorString(omni_err)); \
  } while (0)

namespace omni::offload {
namespace {

using CudaEventPtr = std::shared_ptr<at::cuda::CUDAEvent>;
// Events a host thread may wait on (a disk-tier entry's copy, synchronize-like waits): the
// waiting thread sleeps instead of spinning a core that the disk tier's readers and the
// host-computed experts need (cudaEventBlockingSync); no timing where none is read.
constexpr unsigned int kWaitableEvent = cudaEventDisableTiming | cudaEventBlockingSync;

class CudaEvent final : public Event::Impl {
 public:
  explicit CudaEvent(CudaEventPtr event) : event_(std::move(event)) {}
  bool ready() const override { return event_->query(); }
  void host_wait() const override { event_->synchronize(); }
  const CudaEventPtr& event() const { return event_; }

 private:
  CudaEventPtr event_;
};

// Events with timing, reused: a timing costs two, and creating events per copy in a long-running
// server is wasted work. An event goes back to the pool when its last handle is dropped (it
// is then complete or abandoned; re-recording it is allowed either way).
class TimingEventPool : public std::enable_shared_from_this<TimingEventPool> {
 public:
  ~TimingEventPool() {
    for (auto* e : free_) delete e;
  }
  CudaEventPtr get() {
    at::cuda::CUDAEvent* event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        event = free_.back();
        free_.pop_back();
      }
    }
    if (event == nullptr) event = new at::cuda::CUDAEvent(cudaEventBlockingSync);
    std::weak_ptr<TimingEventPool> pool = shared_from_this();
    return CudaEventPtr(event, [pool](at::cuda::CUDAEvent* e) {
      if (auto p = pool.lock()) {
        std::lock_guard<std::mutex> lock(p->mutex_);
        if (p->free_.size() < kMaxFree) {
          p->free_.push_back(e);
          return;
        }
      }
      delete e;
    });
  }

 private:
  static constexpr size_t kMaxFree = 256;
  std::mutex mutex_;
  std::vector<at::cuda::CUDAEvent*> free_;
};

// While alive, the calling thread's current stream is the engine's compute stream, ordered after
// what the caller had queued on its own stream; at the end the caller's stream waits for the
// forward (its outputs are then safe to read there).
class CudaComputeScope final : public TransferEngine::ComputeScope {
 public:
  CudaComputeScope(c10::cuda::CUDAStream compute)
      : caller_(c10::cuda::getCurrentCUDAStream(compute.device_index())), guard_(compute) {
    if (caller_ != compute) {
      at::cuda::CUDAEvent queued;
      queued.record(caller_);
      queued.block(compute);
    }
  }
  ~CudaComputeScope() override {
    // A sticky CUDA error (an illegal address seen while an exception unwinds this scope) makes
    // the record throw, and a throwing destructor would terminate the process: the error is
    // the stage's to report, from the call that hit it.
    try {
      const auto compute = c10::cuda::getCurrentCUDAStream(caller_.device_index());
      if (caller_ != compute) {
        at::cuda::CUDAEvent done;
        done.record(compute);
        done.block(caller_);
      }
    } catch (const std::exception& e) {
      log_warning("leaving the CUDA compute scope failed: ", e.what());
    }
  }

 private:
  c10::cuda::CUDAStream caller_;
  c10::cuda::CUDAStreamGuard guard_;
};

class CudaTransferEngine final : public TransferEngine {
 public:
  explicit CudaTransferEngine(const TransferEngineOptions& options)
      : device_(c10::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device_index)),
        copy_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index())),
        compute_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index())),
        timing_(cuda_timing_enabled(options)) {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    log_info("CUDA engine on ", describe(), ": runtime ", runtime / 1000, ".", runtime % 1000 / 10,
             ", driver supports ", driver / 1000, ".", driver % 1000 / 10,
             timing_ ? ", timing on" : "");
    // CUDA's minor-version compatibility runs a 13.x runtime on any 13.y driver (features
    // newer than the driver aside); across majors it does not run at all.
    OMNI_CHECK(driver / 1000 >= runtime / 1000, "the CUDA driver (", driver / 1000, ".",
               driver % 1000 / 10, ") is older than the CUDA runtime this build uses (",
               runtime / 1000, ".", runtime % 1000 / 10, "): update the driver");
    if (driver < runtime) {
      log_warning("the CUDA driver (", driver / 1000, ".", driver % 1000 / 10,
                  ") is older than the runtime (", runtime / 1000, ".", runtime % 1000 / 10,
                  "): running under minor-version compatibility (no PTX JIT: a kernel "
                  "shipped only as PTX for a newer runtime would fail when launched)");
    }
  }

  ~CudaTransferEngine() override {
    try {
      synchronize();
    } catch (...) {
      // Destructors must not throw; a failed stream is reported by the call that used it.
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  c10::Device compute_device() const override { return device_; }
  std::string describe() const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_.index()) != cudaSuccess) return "cuda";
    return detail::str_cat("cuda:", static_cast<int>(device_.index()), " (", prop.name, ")");
  }

  HostBuffer allocate_host(size_t bytes, bool pin) override {
    const size_t size = std::max<size_t>(bytes, 1);
    if (pin) {
      c10::cuda::CUDAGuard guard(device_);
      void* data = nullptr;
      const cudaError_t err = cudaHostAlloc(&data, size, cudaHostAllocDefault);
      if (err == cudaSuccess) {
        return make_host_buffer(static_cast<uint8_t*>(data), bytes, /*pinned=*/true,
                                [](uint8_t* p) { cudaFreeHost(p); });
      }
      (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
      std::call_once(pin_warning_, [&] {
        log_warning("cudaHostAlloc of ", bytes, " bytes failed (", cudaGetErrorString(err),
                    "); using pageable host memory: host-to-device copies will be about half "
                    "as fast and will not overlap compute as well");
      });
    }
    auto* data =
        static_cast<uint8_t*>(std::aligned_alloc(kSlabAlignment, align_up(size, kSlabAlignment)));
    OMNI_CHECK(data != nullptr, "out of host memory allocating ", bytes, " bytes");
    return make_host_buffer(data, bytes, /*pinned=*/false, [](uint8_t* p) { std::free(p); });
  }

  DeviceBuffer allocate_device(size_t bytes) override {
    // The caching allocator may hand out memory that kernels already queued on the compute
    // stream still read (it orders reuse on the stream current at allocation: ours, under a
    // ComputeScope). Our copies run on another stream: make it wait for everything queued so
    // far before it can write here.
    c10::cuda::CUDAStreamGuard on_compute(compute_stream_);
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent allocated;
    allocated.record(compute_stream_);
    allocated.block(copy_stream_);
    return DeviceBuffer(
        at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte).device(device_)),
        memory_);
  }

  Event copy_async(const std::vector<CopyOp>& ops, const std::vector<Event>& after,
                   TimeAccumulator* time) override {
    // Every op is checked before any is enqueued: a rejected group copy moves nothing, rather
    // than leaving a slot half written by the ops before the bad one.
    for (const auto& op : ops) {
      OMNI_CHECK(op.src && op.src_offset + op.bytes <= op.src.bytes(),
                 "copy reads past the end of its host buffer (", op.src_offset, " + ", op.bytes,
                 " > ", op.src.bytes(), ")");
      OMNI_CHECK(op.dst && op.dst_offset + op.bytes <= op.dst.bytes(),
                 "copy writes past the end of its device buffer (", op.dst_offset, " + ", op.bytes,
                 " > ", op.dst.bytes(), ")");
      OMNI_CHECK(op.dst.bytes_tensor().device() == device_, "copy into a buffer on ",
                 op.dst.bytes_tensor().device().str(), ", not on this engine's ", device_.str());
    }
    c10::cuda::CUDAGuard guard(device_);
    for (const auto& e : after) {
      if (auto* cuda_event = dynamic_cast<CudaEvent*>(e.impl().get())) {
        cuda_event->event()->block(copy_stream_);
      } else {
        e.host_wait();
      }
    }
    CudaEventPtr start;
    if (timing_) {
      start = events_->get();
      start->record(copy_stream_);
    }
    uint64_t bytes = 0;
    // An op that fails to enqueue throws with the ops before it queued and no event to wait
    // for: the caller would free or refill their host sources at once. Let those finish first.
    struct DrainOnThrow {
      c10::cuda::CUDAStream& stream;
      int exceptions = std::uncaught_exceptions();
      ~DrainOnThrow() {
        if (std::uncaught_exceptions() > exceptions) cudaStreamSynchronize(stream.stream());
      }
    } drain{copy_stream_};
    for (const auto& op : ops) {
      OMNI_CUDA_CHECK(cudaMemcpyAsync(op.dst.data() + op.dst_offset, op.src.data() + op.src_offset,
                                      op.bytes, cudaMemcpyHostToDevice, copy_stream_.stream()));
      // The buffer was allocated on the compute stream, so the caching allocator orders its
      // reuse on that stream only: freed while this copy is queued, the block would go to the
      // next allocation at once and the copy would write into someone else's memory. Recording
      // the copy stream makes the allocator wait, at free time, for the copy stream's work.
      c10::cuda::CUDACachingAllocator::recordStream(op.dst.bytes_tensor().storage().data_ptr(),
                                                    copy_stream_);
      bytes += op.bytes;
    }
    auto end = timing_ ? events_->get() : std::make_shared<at::cuda::CUDAEvent>(kWaitableEvent);
    end->record(copy_stream_);
    bytes_h2d_ += bytes;
    copies_ += 1;
    if (timing_) add_pending({start, end, optional_time(time), Kind::kCopy});
    hold_sources(ops, end);
    return Event(std::make_shared<CudaEvent>(end));
  }

  void compute_wait(const Event& event, TimeAccumulator* stall) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(event.impl().get());
    if (cuda_event == nullptr) {
      event.host_wait();
      return;
    }
    check_in_scope("compute_wait");
    if (cuda_event->ready()) return;
    // The copy is still running: the compute stream will wait on the GPU. With timing, the
    // wait is bracketed with events to learn how long it stalled.
    if (!timing_) {
      cuda_event->event()->block(compute_stream_);
      return;
    }
    auto before = events_->get();
    before->record(compute_stream_);
    cuda_event->event()->block(compute_stream_);
    auto after = events_->get();
    after->record(compute_stream_);
    add_pending({before, after, optional_time(stall), Kind::kStall});
  }

  Event record_compute() override {
    check_in_scope("record_compute");
    auto event = std::make_shared<at::cuda::CUDAEvent>(kWaitableEvent);
    event->record(compute_stream_);
    return Event(std::make_shared<CudaEvent>(event));
  }

  std::unique_ptr<ComputeScope> enter_compute() override {
    return std::make_unique<CudaComputeScope>(compute_stream_);
  }

  int64_t begin_compute_timing() override {
    if (!timing_) return -1;
    auto start = events_->get();
    start->record(compute_stream_);
    std::lock_guard<std::mutex> lock(mutex_);
    // Bounded like the pending timings: a begin without its end (a forward that threw) must
    // not keep its event forever.
    if (open_timings_.size() >= kMaxPendingTimings) {
      open_timings_.erase(open_timings_.begin());
      timings_dropped_ += 1;
    }
    const int64_t token = next_token_++;
    open_timings_[token] = start;
    return token;
  }

  void end_compute_timing(int64_t token, TimeAccumulator* time) override {
    if (token < 0) return;
    auto end = events_->get();
    end->record(compute_stream_);
    CudaEventPtr start;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = open_timings_.find(token);
      if (it == open_timings_.end()) return;
      start = std::move(it->second);
      open_timings_.erase(it);
    }
    add_pending({start, end, optional_time(time), Kind::kCompute});
  }

  size_t device_memory_bytes() override {
    c10::cuda::CUDAGuard guard(device_);
    size_t free = 0, total = 0;
    OMNI_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total;
  }

  DeviceMemoryInfo device_memory() override {
    c10::cuda::CUDAGuard guard(device_);
    DeviceMemoryInfo info;
    OMNI_CUDA_CHECK(cudaMemGetInfo(&info.free, &info.total));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    info.allocator_reserved = static_cast<size_t>(stats.reserved_bytes[all].current);
    info.allocator_allocated = static_cast<size_t>(stats.allocated_bytes[all].current);
    info.reserved_peak = static_cast<size_t>(stats.reserved_bytes[all].peak);
    info.allocated_peak = static_cast<size_t>(stats.allocated_bytes[all].peak);
    return info;
  }

  size_t allocator_peak_bytes() override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return static_cast<size_t>(
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
            .peak);
  }

  void reset_counters() override {
    TransferEngine::reset_counters();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  }

  void synchronize() override {
    c10::cuda::CUDAGuard guard(device_);
    copy_stream_.synchronize();
    compute_stream_.synchronize();
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    release_finished_copies();
  }

  void release_finished_copies() override {
    std::vector<InFlightCopy> done;  // freed after the lock is let go: unpinning takes a while
    std::lock_guard<std::mutex> lock(mutex_);
    take_copied_locked(done);
  }

  size_t release_allocator_cache() override {
    // emptyCache frees only blocks with no pending use: after the synchronize, the copy
    // stream's recorded uses of freed slots are over too.
    synchronize();
    const size_t before = device_memory().allocator_reserved;
    c10::cuda::CUDACachingAllocator::emptyCache();
    const size_t after = device_memory().allocator_reserved;
    log_debug("CUDA engine: gave ", before > after ? before - after : 0,
              " cached bytes back to the device");
    return before > after ? before - after : 0;
  }

  void collect_timings() override {
    synchronize();
    std::lock_guard<std::mutex> lock(mutex_);
    resolve_ready_locked();
  }

 private:
  // The forward's kernels go to the current stream; the engine's events are on its compute
  // stream. Outside a ComputeScope the two differ and the kernels would not wait for their
  // weights: refuse rather than compute with half-copied weights.
  void check_in_scope(const char* call) const {
    OMNI_CHECK(c10::cuda::getCurrentCUDAStream(device_.index()) == compute_stream_, call,
               "() outside the engine's compute scope: run forwards inside "
               "OffloadBackend::forward_scope() (or TransferEngine::enter_compute())");
  }

  // The host memory a queued copy reads stays allocated until the copy has run. A caller may
  // drop its last handle to a source as soon as copy_async returns (a backend torn down, a
  // staging buffer replaced); the DMA engine would then read freed memory, or memory already
  // handed to someone else, and nothing reports it: the device gets garbage weights. The
  // simulated device holds its sources the same way (CopyPart), so both engines free a host
  // buffer only after the last copy from it.
  struct InFlightCopy {
    CudaEventPtr end;
    std::vector<HostBuffer> sources;  // one handle per distinct buffer
  };

  void hold_sources(const std::vector<CopyOp>& ops, const CudaEventPtr& end) {
    InFlightCopy copy{end, {}};
    for (const auto& op : ops) {
      const bool seen = std::any_of(copy.sources.begin(), copy.sources.end(),
                                    [&](const HostBuffer& b) { return b.data() == op.src.data(); });
      if (!seen) copy.sources.push_back(op.src);
    }
    std::vector<InFlightCopy> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      take_copied_locked(done);
      in_flight_.push_back(std::move(copy));
    }
    // `done` goes out of scope here, outside the lock: freeing pinned memory can take a while.
  }

  // Copies on one stream complete in order: the finished ones are at the front.
  void take_copied_locked(std::vector<InFlightCopy>& done) {
    while (!in_flight_.empty() && in_flight_.front().end->query()) {
      done.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
  }

  enum class Kind { kCopy, kStall, kCompute };
  struct Pending {
    CudaEventPtr start;
    CudaEventPtr end;
    std::optional<TimeAccumulator> time;  // a handle, never a pointer into a backend
    Kind kind;
  };

  static std::optional<TimeAccumulator> optional_time(const TimeAccumulator* time) {
    if (time == nullptr) return std::nullopt;
    return *time;
  }

  // Queues a timing and resolves the ones already complete, without waiting; beyond
  // kMaxPendingTimings the oldest are dropped (counted): nobody is collecting them.
  void add_pending(Pending p) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(std::move(p));
    resolve_ready_locked();
    while (pending_.size() > kMaxPendingTimings) {
      pending_.pop_front();
      timings_dropped_ += 1;
    }
  }

  // Oldest first, up to the first whose end has not happened yet (never blocks).
  void resolve_ready_locked() {
    while (!pending_.empty() && pending_.front().end->query()) {
      const Pending& p = pending_.front();
      const auto ns =
          static_cast<int64_t>(static_cast<double>(p.start->elapsed_time(*p.end)) * 1e6);
      if (p.kind == Kind::kCopy) copy_ns_ += ns;
      if (p.kind == Kind::kStall) count_stall(ns);
      if (p.time) p.time->add(ns);
      pending_.pop_front();
    }
  }

  c10::Device device_;
  c10::cuda::CUDAStream copy_stream_;
  c10::cuda::CUDAStream compute_stream_;
  const bool timing_;
  std::shared_ptr<TimingEventPool> events_ = std::make_shared<TimingEventPool>();
  std::once_flag pin_warning_;
  std::mutex mutex_;
  std::deque<Pending> pending_;
  std::deque<InFlightCopy> in_flight_;            // oldest first
  std::map<int64_t, CudaEventPtr> open_timings_;  // by token: the oldest first
  int64_t next_token_ = 0;
};

}  // namespace

bool cuda_engine_built() { return true; }

int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::shared_ptr<TransferEngine> make_cuda_engine(const TransferEngineOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  OMNI_CHECK(err == cudaSuccess && count > 0,
             "device 'cuda' requested but no CUDA device is "
             "usable (",
             err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")");
  OMNI_CHECK(options.cuda_device_index >= 0 && options.cuda_device_index < count,
             "CUDA device index ", options.cuda_device_index, " out of range (", count,
             " devices)");
  return std::make_shared<CudaTransferEngine>(options);
}

}  // namespace omni::offload
