// The CUDA transfer engine: a high-priority copy stream, events between the copy and the
// compute streams (compute waits on the GPU, the host never blocks), exact-size pinned host
// memory from cudaHostAlloc. LibTorch's caching host allocator rounds every block up to a
// power of two, which can double the host memory a model needs, so we do not use it.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

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

class CudaEvent final : public Event::Impl {
 public:
  explicit CudaEvent(CudaEventPtr event) : event_(std::move(event)) {}
  bool ready() const override { return event_->query(); }
  void host_wait() const override { event_->synchronize(); }
  const CudaEventPtr& event() const { return event_; }

 private:
  CudaEventPtr event_;
};

CudaEventPtr timing_event() { return std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault); }

class CudaTransferEngine final : public TransferEngine {
 public:
  explicit CudaTransferEngine(const TransferEngineOptions& options)
      : device_(c10::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device_index)),
        copy_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index())) {}

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
    // stream still read (it orders reuse on that stream only). Our copies run on another
    // stream: make it wait for everything queued so far before it can write here.
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent allocated;
    allocated.record(c10::cuda::getCurrentCUDAStream(device_.index()));
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
    auto start = timing_event();
    start->record(copy_stream_);
    uint64_t bytes = 0;
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
    auto end = timing_event();
    end->record(copy_stream_);
    bytes_h2d_ += bytes;
    copies_ += 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back({start, end, time, Kind::kCopy});
    }
    return Event(std::make_shared<CudaEvent>(end));
  }

  void compute_wait(const Event& event, TimeAccumulator* stall) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(event.impl().get());
    if (cuda_event == nullptr) {
      event.host_wait();
      return;
    }
    auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
    if (cuda_event->ready()) return;
    // The copy is still running: the compute stream will wait on the GPU. Bracket the wait
    // with timing events to learn how long it stalled.
    auto before = timing_event();
    before->record(compute);
    cuda_event->event()->block(compute);
    auto after = timing_event();
    after->record(compute);
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({before, after, stall, Kind::kStall});
  }

  Event record_compute() override {
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return Event(std::make_shared<CudaEvent>(event));
  }

  int64_t begin_compute_timing() override {
    auto start = timing_event();
    start->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t token = next_token_++;
    open_timings_[token] = start;
    return token;
  }

  void end_compute_timing(int64_t token, TimeAccumulator* time) override {
    auto end = timing_event();
    end->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_timings_.find(token);
    if (it == open_timings_.end()) return;
    pending_.push_back({it->second, end, time, Kind::kCompute});
    open_timings_.erase(it);
  }

  size_t device_memory_bytes() override {
    c10::cuda::CUDAGuard guard(device_);
    size_t free = 0, total = 0;
    OMNI_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total;
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
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
  }

  void collect_timings() override {
    synchronize();
    std::vector<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending.swap(pending_);
    }
    for (const auto& p : pending) {
      const auto ns =
          static_cast<int64_t>(static_cast<double>(p.start->elapsed_time(*p.end)) * 1e6);
      if (p.kind == Kind::kCopy) copy_ns_ += ns;
      if (p.kind == Kind::kStall) count_stall(ns);
      if (p.time) p.time->add(ns);
    }
  }

 private:
  enum class Kind { kCopy, kStall, kCompute };
  struct Pending {
    CudaEventPtr start;
    CudaEventPtr end;
    TimeAccumulator* time;
    Kind kind;
  };

  c10::Device device_;
  c10::cuda::CUDAStream copy_stream_;
  std::once_flag pin_warning_;
  std::mutex mutex_;
  std::vector<Pending> pending_;
  std::unordered_map<int64_t, CudaEventPtr> open_timings_;
  int64_t next_token_ = 0;
};

}  // namespace

bool cuda_engine_built() { return true; }

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
