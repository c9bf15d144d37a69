#include "backend_base.h"

#include <unordered_map>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "module_paths.h"

namespace omni::offload {
namespace {
constexpr const char* kHookName = "omni_offload";

std::unordered_map<std::string, at::Tensor> tensors_by_name(torch::nn::Module& root) {
  std::unordered_map<std::string, at::Tensor> out;
  for (const auto& p : root.named_parameters(true)) out.emplace(p.key(), p.value());
  for (const auto& b : root.named_buffers(true)) out.emplace(b.key(), b.value());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> lookup(
    const std::unordered_map<std::string, at::Tensor>& table,
    const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& n : names) {
    auto it = table.find(n);
    OMNI_CHECK(it != table.end(), "tensor '", n, "' disappeared from the model since planning");
    out.emplace_back(n, it->second);
  }
  return out;
}
}  // namespace

BackendBase::BackendBase(torch::nn::Module& root, OffloadPlan plan,
                         std::shared_ptr<TransferEngine> engine, const OffloadConfig& config)
    : OffloadBackend(std::move(plan), std::move(engine)),
      root_(root),
      config_(config),
      tensors_(tensors_by_name(root)) {}

BackendBase::~BackendBase() {
  for (auto& [module, method] : attached_) module->hooks().detach(method, kHookName);
  wait_for_device();  // before resident_buffer_ goes
}

void BackendBase::wait_for_device() noexcept {
  try {
    engine_->synchronize();
  } catch (...) {
    // Nothing useful to do with a failed stream while tearing down.
  }
}

void BackendBase::make_resident() {
  if (plan_.resident_tensors.empty()) return;
  // Resident weights never leave the device, so they get no host slab: they stream through
  // a small staging buffer, each original let go once it is on the device.
  resident_ = OffloadUnit::layout_only("resident", lookup(tensors_, plan_.resident_tensors),
                                       &config_.convert_dtypes);
  resident_buffer_ = engine_->allocate_device(resident_->bytes());
  resident_->stream_to_device(*engine_, resident_buffer_, 0, config_.staging_bytes,
                              config_.pin_memory);
}

int BackendBase::add_unit(const UnitPlan& plan, bool prefetched) {
  auto unit = std::make_unique<OffloadUnit>(plan.name, lookup(tensors_, plan.tensor_names),
                                            *engine_, config_.pin_memory, &config_.convert_dtypes);
  // A copy from pageable memory is staged by the driver and returns only when done: a
  // prefetch would no longer overlap compute, and the "offload" would silently run at copy
  // plus compute speed. Better a clear error than that, unless pinning was turned off.
  OMNI_CHECK(!prefetched || !config_.pin_memory || unit->host().pinned(), "pinning ", unit->bytes(),
             " bytes of host memory for unit '", plan.name, "' failed (",
             engine_->host_counter()->current(),
             " bytes of host slabs held): ", to_string(strategy()),
             " offload prefetches while computing, which needs pinned memory. Free host "
             "memory or raise the locked-memory limit (ulimit -l), or turn pinning off "
             "(pin_memory = false, --no-cpu-offload-pin-memory) to accept copies that do not "
             "overlap compute");
  units_.push_back(std::move(unit));
  counters_.push_back(std::make_unique<UnitCounters>());
  return static_cast<int>(units_.size()) - 1;
}

std::unique_ptr<OffloadUnit> BackendBase::disk_unit(const UnitPlan& plan,
                                                    const TensorFiles& files) {
  return DiskTier::leave_on_disk(plan.name, lookup(tensors_, plan.tensor_names),
                                 &config_.convert_dtypes, files, config_.disk_read);
}

int BackendBase::push_unit(std::unique_ptr<OffloadUnit> unit) {
  units_.push_back(std::move(unit));
  counters_.push_back(std::make_unique<UnitCounters>());
  return static_cast<int>(units_.size()) - 1;
}

void BackendBase::ensure_on_device(const std::string& path) { find_module(root_, path); }

std::vector<int> BackendBase::units_at(const std::string& path) const {
  std::vector<int> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (path_is_under(units_[u]->name(), path) || path_is_under(path, units_[u]->name())) {
      out.push_back(static_cast<int>(u));
    }
  }
  return out;
}

void BackendBase::attach_hook(const std::string& path, const std::shared_ptr<ModelHook>& hook) {
  HookableModule& module = find_hookable(root_, path);
  for (const auto& method : module.hooks().methods()) {
    module.hooks().attach(method, kHookName, hook);
    attached_.emplace_back(&module, method);
  }
}

OffloadStats BackendBase::stats() {
  engine_->collect_timings();
  OffloadStats s;
  s.strategy = to_string(strategy());
  s.device = engine_->describe();
  s.param_bytes = plan_.param_bytes;
  s.resident_bytes = resident_device_bytes();
  s.max_unit_bytes = max_unit_bytes();
  s.host_bytes = engine_->host_counter()->current();
  s.peak_device_bytes = engine_->memory_counter()->peak();
  s.current_device_bytes = engine_->memory_counter()->current();
  const DeviceMemoryInfo device = engine_->device_memory();
  s.allocator_reserved_peak_bytes = device.reserved_peak;
  s.allocator_allocated_peak_bytes = device.allocated_peak;
  s.host_peak_bytes = engine_->host_counter()->peak();
  const TransferCounters c = engine_->counters();
  s.bytes_h2d = c.bytes_h2d;
  s.copy_ms = c.copy_ms;
  s.stall_ms = c.stall_ms;
  for (size_t i = 0; i < units_.size(); ++i) {
    const auto& k = *counters_[i];
    UnitStats u;
    u.name = units_[i]->name();
    u.bytes = units_[i]->bytes();
    u.loads = k.loads.load();
    u.sync_loads = k.sync_loads.load();
    u.copy_ms = k.copy.total_ms();
    u.compute_ms = k.compute.total_ms();
    u.stall_ms = k.stall.total_ms();
    s.loads += u.loads;
    s.sync_loads += u.sync_loads;
    s.units.push_back(std::move(u));
  }
  return s;
}

void BackendBase::reset_stats() {
  engine_->collect_timings();
  engine_->reset_counters();
  for (auto& k : counters_) {
    k->copy.reset();
    k->compute.reset();
    k->stall.reset();
    k->loads = 0;
    k->sync_loads = 0;
  }
}

namespace {
class ResidentBackend final : public BackendBase {
 public:
  ResidentBackend(torch::nn::Module& root, OffloadPlan plan, std::shared_ptr<TransferEngine> engine,
                  const OffloadConfig& config)
      : BackendBase(root, std::move(plan), std::move(engine), config) {
    make_resident();
  }
  Strategy strategy() const override { return Strategy::kNone; }
  // The forwards only read the weights: nothing is bound, copied or evicted.
  bool forwards_may_overlap() const override { return true; }

 protected:
  size_t max_unit_bytes() const override { return 0; }
};
}  // namespace

std::unique_ptr<TransferEngine::ComputeScope> OffloadBackend::overlapping_scope() {
  OMNI_CHECK(forwards_may_overlap(), to_string(strategy()),
             " offload moves weights during a forward: forwards may not overlap");
  return engine_->enter_compute();
}

std::unique_ptr<OffloadBackend> make_resident_backend(torch::nn::Module& root, OffloadPlan plan,
                                                      std::shared_ptr<TransferEngine> engine,
                                                      const OffloadConfig& config) {
  return std::make_unique<ResidentBackend>(root, std::move(plan), std::move(engine), config);
}

std::unique_ptr<OffloadBackend> apply_offload(torch::nn::Module& root, const ModelSpec& spec,
                                              const OffloadConfig& config,
                                              std::shared_ptr<TransferEngine> engine) {
  OMNI_CHECK(engine != nullptr, "apply_offload needs a transfer engine");
  const bool offloading = config.model_level || config.layerwise;
  const ModelSpec resolved = offloading ? resolve_model_spec(root, spec) : spec;
  OffloadPlan plan = make_offload_plan(root, resolved, config);
  log_debug("offload plan: ", plan.describe());
  switch (plan.strategy) {
    case Strategy::kLayerwise:
      return make_layerwise_backend(root, std::move(plan), std::move(engine), config);
    case Strategy::kModelLevel:
      return make_model_level_backend(root, std::move(plan), std::move(engine), config);
    case Strategy::kComponent:
      return make_component_backend(root, std::move(plan), std::move(engine), config);
    case Strategy::kNone:
      break;
  }
  return make_resident_backend(root, std::move(plan), std::move(engine), config);
}

}  // namespace omni::offload
