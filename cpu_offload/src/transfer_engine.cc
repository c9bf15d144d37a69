#include "cpu_offload/transfer_engine.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "cpu_offload/check.h"
#include "cpu_offload/option_names.h"

namespace omni::offload {

std::string resolve_device(const std::string& name, std::string* why) {
  if (name != "auto") return name;
  std::string reason;
  std::string device = "cpu";
  if (!cuda_engine_built()) {
    reason = "this build has no CUDA engine";
  } else if (const int count = cuda_device_count(); count == 0) {
    reason = "no CUDA device is usable";
  } else {
    device = "cuda";
    reason = std::to_string(count) + " CUDA device" + (count > 1 ? "s" : "");
  }
  if (why != nullptr) *why = reason;
  return device;
}

DeviceKind parse_device_kind(const std::string& text) {
  if (text == "auto") return parse_device_kind(resolve_device(text));
  if (text == "cpu" || text == "cpu-sim") return DeviceKind::kCpuSim;
  if (text == "cuda" || text == "gpu") return DeviceKind::kCuda;
  OMNI_THROW("unknown device '", text, "' (expected ", names::listed(names::device_kinds()), ")");
}

std::string to_string(DeviceKind kind) { return kind == DeviceKind::kCuda ? "cuda" : "cpu"; }

std::string to_string(DeviceRuleViolation::Kind kind) {
  switch (kind) {
    case DeviceRuleViolation::Kind::kFreedWhileCopyPending:
      return "freed while a copy into it is pending";
    case DeviceRuleViolation::Kind::kBoundBeforeCopyWaited:
      return "bound before compute waited for its copy";
    case DeviceRuleViolation::Kind::kCopyIntoBoundRange:
      return "copy into a range still bound as parameters";
    case DeviceRuleViolation::Kind::kCopyNotOrderedAfterReaders:
      return "copy not ordered after the compute that read the range";
    case DeviceRuleViolation::Kind::kComputeOutsideScope:
      return "compute outside the engine's compute scope";
  }
  return "unknown violation";
}

bool cuda_timing_enabled(const TransferEngineOptions& options) {
  if (options.cuda_timing) return *options.cuda_timing;
  const char* env = std::getenv("OMNI_CUDA_TIMING");
  return env != nullptr && std::string(env) == "1";
}

bool sim_strict_enabled(const TransferEngineOptions& options) {
  if (options.sim_strict) return *options.sim_strict;
  const char* env = std::getenv("OMNI_SIM_STRICT");
  if (env == nullptr || *env == '\0') return false;
  const std::string value(env);
  if (value == "1" || value == "on" || value == "true") return true;
  if (value == "0" || value == "off" || value == "false") return false;
  OMNI_THROW("OMNI_SIM_STRICT='", value, "' (expected 1 or 0)");
}

void DeviceMemoryCounter::add(size_t bytes) {
  allocations_ += 1;
  const size_t now = current_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void DeviceMemoryCounter::remove(size_t bytes) { current_.fetch_sub(bytes); }

DeviceBuffer::DeviceBuffer(at::Tensor bytes, std::shared_ptr<DeviceMemoryCounter> counter,
                           std::shared_ptr<Observer> observer)
    : state_(std::make_shared<State>()) {
  state_->bytes = std::move(bytes);
  state_->counter = std::move(counter);
  state_->observer = std::move(observer);
  state_->counter->add(static_cast<size_t>(state_->bytes.numel()));
}

DeviceBuffer::State::~State() {
  if (observer) observer->on_free();
  if (counter) counter->remove(static_cast<size_t>(bytes.numel()));
}

uint8_t* DeviceBuffer::data() const {
  return state_ ? static_cast<uint8_t*>(state_->bytes.data_ptr()) : nullptr;
}

TransferCounters TransferEngine::counters() {
  TransferCounters c;
  c.bytes_h2d = bytes_h2d_.load();
  c.copies = copies_.load();
  c.copy_ms = static_cast<double>(copy_ns_.load()) / 1e6;
  c.stall_ms = static_cast<double>(stall_ns_.load()) / 1e6;
  c.timings_dropped = timings_dropped_.load();
  c.cache_returns = cache_returns_.load();
  return c;
}

size_t TransferEngine::return_cached_memory() {
  cache_returns_ += 1;
  return release_allocator_cache();
}

void TransferEngine::reset_counters() {
  bytes_h2d_ = 0;
  copies_ = 0;
  copy_ns_ = 0;
  stall_ns_ = 0;
  timings_dropped_ = 0;
  cache_returns_ = 0;
  memory_->reset_peak();
  host_->reset_peak();
}

void TransferEngine::count_copy(uint64_t bytes, int64_t ns) {
  bytes_h2d_ += bytes;
  copies_ += 1;
  copy_ns_ += ns;
}

void TransferEngine::count_stall(int64_t ns) { stall_ns_ += ns; }

HostBuffer TransferEngine::make_host_buffer(uint8_t* data, size_t bytes, bool pinned,
                                            std::function<void(uint8_t*)> free_fn) {
  host_->add(bytes);
  std::shared_ptr<DeviceMemoryCounter> counter = host_;
  std::shared_ptr<uint8_t> owner(data, [counter, bytes, free_fn = std::move(free_fn)](uint8_t* p) {
    free_fn(p);
    counter->remove(bytes);
  });
  return HostBuffer(std::move(owner), bytes, pinned);
}

std::shared_ptr<TransferEngine> make_transfer_engine(DeviceKind kind,
                                                     const TransferEngineOptions& options) {
  if (kind == DeviceKind::kCuda) return make_cuda_engine(options);
  return make_cpu_sim_engine(options);
}

}  // namespace omni::offload
