#include "cpu_offload/expert_cache.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload {

std::string ExpertCacheStats::to_json() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(4);
  os << "{\"requests\": " << requests << ", \"uses\": " << uses() << ", \"hits\": " << hits
     << ", \"misses\": " << misses << ", \"host_computed\": " << host_computed
     << ", \"prefetched\": " << prefetched << ", \"prefetch_hits\": " << prefetch_hits
     << ", \"loads\": " << loads << ", \"evictions\": " << evictions
     << ", \"bytes_h2d\": " << bytes_h2d << ", \"stall_ms\": " << stall_ms
     << ", \"hit_rate\": " << hit_rate() << ", \"prefetch_hit_rate\": " << prefetch_hit_rate()
     << ", \"expert_bytes\": " << expert_bytes << ", \"experts\": " << experts
     << ", \"slots\": " << slots << ", \"budget_bytes\": " << budget_bytes
     << ", \"device_bytes\": " << device_bytes << "}";
  return os.str();
}

ExpertCache::ExpertCache(std::vector<std::unique_ptr<OffloadUnit>> units,
                         std::shared_ptr<TransferEngine> engine, const ExpertCacheOptions& options)
    : engine_(std::move(engine)), options_(options), units_(std::move(units)) {
  OMNI_CHECK(engine_ != nullptr, "the expert cache needs a transfer engine");
  OMNI_CHECK(!units_.empty(), "the expert cache has no experts");
  for (size_t k = 0; k < units_.size(); ++k) {
    OMNI_CHECK(units_[k]->host(), "expert '", units_[k]->name(), "' has no host slab");
    slot_bytes_ = std::max(slot_bytes_, units_[k]->bytes());
    key_by_name_.emplace(units_[k]->name(), static_cast<int>(k));
  }
  if (options_.miss_policy != ExpertMissPolicy::kHost) {
    OMNI_CHECK(options_.budget_bytes >= slot_bytes_, "expert_cache_budget (", options_.budget_bytes,
               " bytes) is smaller than one expert (", slot_bytes_, " bytes, '",
               units_.front()->name(), "'): raise it to at least ", slot_bytes_, " bytes");
  }
  const size_t count = std::min(units_.size(), options_.budget_bytes / slot_bytes_);
  entries_.resize(units_.size());
  slots_.resize(count);
  if (count > 0) pool_ = engine_->allocate_device(count * slot_bytes_);
  stats_.expert_bytes = slot_bytes_;
  stats_.experts = units_.size();
  stats_.slots = count;
  stats_.budget_bytes = options_.budget_bytes;
  stats_.device_bytes = count * slot_bytes_;
  log_debug("expert cache: ", units_.size(), " experts of ", slot_bytes_, " bytes, ", count,
            " device slots (budget ", options_.budget_bytes, " bytes), miss policy ",
            to_string(options_.miss_policy));
}

ExpertCache::~ExpertCache() {
  try {
    engine_->synchronize();  // settles prefetches nobody waited for before the pool goes
  } catch (...) {
  }
  for (auto& unit : units_) {
    if (unit->bound()) unit->unbind();
  }
}

int ExpertCache::key_of(const std::string& name) const {
  auto it = key_by_name_.find(name);
  return it == key_by_name_.end() ? -1 : it->second;
}

int ExpertCache::pick_victim(const std::vector<char>& protect) const {
  int best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const int key = slots_[s].key;
    if (key < 0) return static_cast<int>(s);
    if (protect[key]) continue;
    if (best < 0 || entries_[key].last_use < entries_[slots_[best].key].last_use) {
      best = static_cast<int>(s);
    }
  }
  return best;
}

void ExpertCache::evict(int slot) {
  const int old = slots_[slot].key;
  if (old < 0) return;
  if (units_[old]->bound()) units_[old]->unbind();
  entries_[old] = Entry{-1, Event(), false, false, false, entries_[old].last_use};
  slots_[slot].key = -1;
  stats_.evictions += 1;
}

Event ExpertCache::copy_in(const std::vector<int>& keys, const std::vector<int>& slots) {
  std::vector<CopyOp> ops;
  ops.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops.push_back(units_[keys[i]]->copy_to(pool_, static_cast<size_t>(slots[i]) * slot_bytes_));
  }
  // Recorded after the victims were unbound: every compute that read their slots comes before.
  const Event readers_done = engine_->record_compute();
  const Event ready = engine_->copy_async(ops, {readers_done});
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry& e = entries_[keys[i]];
    e.slot = slots[i];
    e.ready = ready;
    e.waited = false;
    slots_[slots[i]].key = keys[i];
    stats_.loads += 1;
    stats_.bytes_h2d += units_[keys[i]]->bytes();
  }
  return ready;
}

void ExpertCache::bind_host(int key) {
  OffloadUnit& unit = *units_[key];
  const HostBuffer host = unit.host();
  // A byte tensor over the slab that keeps the slab alive while views of it exist.
  auto keep = std::make_shared<HostBuffer>(host);
  const at::Tensor slab = at::from_blob(
      host.data(), {static_cast<int64_t>(host.bytes())}, [keep](void*) mutable { keep.reset(); },
      at::TensorOptions(at::kByte));
  c10::InferenceMode normal_tensors(false);
  for (const auto& t : unit.tensors()) {
    t.tensor.set_data(make_view(slab, t.offset, t.sizes, t.dtype));
  }
  entries_[key].host_bound = true;
  host_bound_.push_back(key);
}

void ExpertCache::unbind_host_bound() {
  for (int key : host_bound_) {
    if (!entries_[key].host_bound) continue;
    entries_[key].host_bound = false;
    units_[key]->unbind();
  }
  host_bound_.clear();
}

void ExpertCache::record_host_compute(double flops, double ms) {
  host_flops_ += flops;
  host_ms_ += ms;
}

bool ExpertCache::fetch_is_faster(int key, int64_t rows) const {
  if (slots_.empty()) return false;
  switch (options_.miss_policy) {
    case ExpertMissPolicy::kFetch:
      return true;
    case ExpertMissPolicy::kHost:
      return false;
    case ExpertMissPolicy::kAuto:
      break;
  }
  const OffloadUnit& unit = *units_[key];
  double numel = 0;
  for (const auto& t : unit.tensors())
    numel += static_cast<double>(t.nbytes) / c10::elementSize(t.dtype);
  const double flops = 2.0 * numel * static_cast<double>(std::max<int64_t>(rows, 1));
  const TransferCounters c = engine_->counters();
  if (c.copy_ms <= 0 || c.bytes_h2d == 0) return true;  // measure the link first
  const double link_bytes_per_ms = static_cast<double>(c.bytes_h2d) / c.copy_ms;
  double host_flops_per_ms = host_ms_ > 0 ? host_flops_ / host_ms_ : options_.host_flops_hint / 1e3;
  if (host_flops_per_ms <= 0) return false;  // then measure the host once
  const double fetch_ms = static_cast<double>(unit.bytes()) / link_bytes_per_ms;
  const double host_ms = flops / host_flops_per_ms;
  return fetch_ms <= host_ms;
}

std::vector<ExpertCache::Placement> ExpertCache::ensure(const std::vector<int>& keys,
                                                        const std::vector<int64_t>& rows) {
  unbind_host_bound();
  stats_.requests += 1;
  ++tick_;
  std::vector<char> protect(units_.size(), 0);
  for (int key : keys) {
    OMNI_CHECK(key >= 0 && static_cast<size_t>(key) < units_.size(), "expert key ", key,
               " out of range (", units_.size(), " experts)");
    OMNI_CHECK(!protect[key], "expert '", units_[key]->name(), "' asked for twice in one call");
    protect[key] = 1;
  }
  std::vector<Placement> placement(keys.size(), Placement::kDevice);
  std::vector<int> misses, miss_slots, to_wait;
  // Hits first: they must not be chosen as victims for the misses.
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry& e = entries_[keys[i]];
    e.last_use = tick_;
    if (e.slot < 0) continue;
    stats_.hits += 1;
    if (e.prefetched) {
      stats_.prefetch_hits += 1;
      e.prefetched = false;
    }
    if (!e.waited) to_wait.push_back(keys[i]);
  }
  // Where each miss runs, decided once (the auto policy reads counters that move).
  std::vector<char> fetch(keys.size(), 0);
  size_t on_device = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (entries_[keys[i]].slot >= 0) {
      ++on_device;
    } else if (fetch_is_faster(keys[i], i < rows.size() ? rows[i] : 1)) {
      fetch[i] = 1;
      ++on_device;
    }
  }
  OMNI_CHECK(on_device <= slots_.size(), "expert cache: ", on_device,
             " experts needed on the device at once but only ", slots_.size(),
             " fit the budget (call ensure() in chunks of at most slots())");
  for (size_t i = 0; i < keys.size(); ++i) {
    const int key = keys[i];
    if (entries_[key].slot >= 0) continue;
    stats_.misses += 1;
    if (!fetch[i]) {
      stats_.host_computed += 1;
      placement[i] = Placement::kHost;
      bind_host(key);
      continue;
    }
    const int slot = pick_victim(protect);
    OMNI_CHECK(slot >= 0, "expert cache: no slot left for '", units_[key]->name(), "'");
    evict(slot);
    slots_[slot].key = key;  // taken: not picked again in this call
    misses.push_back(key);
    miss_slots.push_back(slot);
  }
  if (!misses.empty()) {
    copy_in(misses, miss_slots);
    to_wait.insert(to_wait.end(), misses.begin(), misses.end());
  }
  // One wait per distinct event (the copy stream is FIFO, so waiting for the latest copy
  // would do; each is waited for explicitly to keep the rule simple to check).
  std::vector<const Event::Impl*> waited;
  for (int key : to_wait) {
    Entry& e = entries_[key];
    const Event::Impl* id = e.ready.impl().get();
    if (std::find(waited.begin(), waited.end(), id) == waited.end()) {
      engine_->compute_wait(e.ready, &stall_);
      waited.push_back(id);
    }
    e.waited = true;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (placement[i] != Placement::kDevice) continue;
    Entry& e = entries_[keys[i]];
    if (!units_[keys[i]]->bound()) {
      units_[keys[i]]->bind(pool_, static_cast<size_t>(e.slot) * slot_bytes_);
    }
  }
  current_ = keys;
  return placement;
}

size_t ExpertCache::prefetch(const std::vector<int>& keys) {
  if (slots_.empty()) return 0;
  std::vector<char> protect(units_.size(), 0);
  for (int key : current_) protect[key] = 1;
  std::vector<int> loads, load_slots;
  for (int key : keys) {
    OMNI_CHECK(key >= 0 && static_cast<size_t>(key) < units_.size(), "expert key ", key,
               " out of range (", units_.size(), " experts)");
    if (protect[key]) continue;
    protect[key] = 1;
    Entry& e = entries_[key];
    if (e.slot >= 0) continue;  // on the device or arriving
    if (options_.miss_policy == ExpertMissPolicy::kHost) continue;
    const int slot = pick_victim(protect);
    if (slot < 0) break;  // every slot holds an expert in use or asked for
    evict(slot);
    slots_[slot].key = key;
    loads.push_back(key);
    load_slots.push_back(slot);
  }
  if (loads.empty()) return 0;
  ++tick_;
  copy_in(loads, load_slots);
  for (int key : loads) {
    entries_[key].prefetched = true;
    entries_[key].last_use = tick_;
  }
  stats_.prefetched += loads.size();
  return loads.size();
}

ExpertCacheStats ExpertCache::stats() {
  engine_->collect_timings();  // CUDA resolves stall times from events
  ExpertCacheStats s = stats_;
  s.stall_ms = stall_.total_ms();
  return s;
}

void ExpertCache::reset_stats() {
  ExpertCacheStats fresh;
  fresh.expert_bytes = stats_.expert_bytes;
  fresh.experts = stats_.experts;
  fresh.slots = stats_.slots;
  fresh.budget_bytes = stats_.budget_bytes;
  fresh.device_bytes = stats_.device_bytes;
  stats_ = fresh;
  stall_.reset();
}

void ExpertCache::clear() {
  unbind_host_bound();
  engine_->synchronize();
  for (size_t s = 0; s < slots_.size(); ++s) {
    const int key = slots_[s].key;
    if (key < 0) continue;
    if (units_[key]->bound()) units_[key]->unbind();
    entries_[key] = Entry{-1, Event(), false, false, false, entries_[key].last_use};
    slots_[s].key = -1;
  }
  current_.clear();
}

std::unique_ptr<ExpertCache> make_expert_cache(torch::nn::Module& root, const OffloadPlan& plan,
                                               const OffloadConfig& config,
                                               std::shared_ptr<TransferEngine> engine) {
  if (plan.experts.empty()) return nullptr;
  std::unordered_map<std::string, at::Tensor> table;
  for (const auto& p : root.named_parameters(true)) table.emplace(p.key(), p.value());
  for (const auto& b : root.named_buffers(true)) table.emplace(b.key(), b.value());
  std::vector<std::unique_ptr<OffloadUnit>> units;
  units.reserve(plan.experts.size());
  size_t total = 0;
  for (const auto& expert : plan.experts) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : expert.tensor_names) {
      auto it = table.find(name);
      OMNI_CHECK(it != table.end(), "tensor '", name,
                 "' disappeared from the model since planning");
      tensors.emplace_back(name, it->second);
    }
    OMNI_CHECK(!tensors.empty(), "expert module '", expert.name, "' holds no tensors");
    units.push_back(std::make_unique<OffloadUnit>(expert.name, tensors, *engine, config.pin_memory,
                                                  &config.convert_dtypes));
    total += units.back()->bytes();
  }
  ExpertCacheOptions options;
  options.miss_policy = config.expert_miss_policy;
  options.budget_bytes = config.expert_cache_budget_bytes;
  if (options.budget_bytes == 0) {
    options.budget_bytes =
        static_cast<size_t>(config.expert_cache_budget_fraction * static_cast<double>(total));
  }
  return std::make_unique<ExpertCache>(std::move(units), std::move(engine), options);
}

}  // namespace omni::offload
