#include "cpu_offload/expert_cache.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
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
     << ", \"prefetch_scored\": " << prefetch_scored
     << ", \"prefetch_scored_used\": " << prefetch_scored_used
     << ", \"prefetch_precision\": " << prefetch_precision()
     << ", \"prefetch_skipped\": " << prefetch_skipped << ", \"loads\": " << loads
     << ", \"evictions\": " << evictions << ", \"bytes_h2d\": " << bytes_h2d
     << ", \"stall_ms\": " << stall_ms << ", \"hit_rate\": " << hit_rate()
     << ", \"prefetch_hit_rate\": " << prefetch_hit_rate() << ", \"expert_bytes\": " << expert_bytes
     << ", \"experts\": " << experts << ", \"slots\": " << slots
     << ", \"budget_bytes\": " << budget_bytes << ", \"device_bytes\": " << device_bytes << "}";
  return os.str();
}

ExpertCache::ExpertCache(std::vector<std::unique_ptr<OffloadUnit>> units,
                         std::shared_ptr<TransferEngine> engine, const ExpertCacheOptions& options,
                         std::unique_ptr<DiskTier> disk, const TensorFiles* files)
    : engine_(std::move(engine)),
      options_(options),
      units_(std::move(units)),
      disk_(std::move(disk)) {
  OMNI_CHECK(engine_ != nullptr, "the expert cache needs a transfer engine");
  OMNI_CHECK(!units_.empty(), "the expert cache has no experts");
  disk_id_.assign(units_.size(), -1);
  for (size_t k = 0; k < units_.size(); ++k) {
    if (!units_[k]->host()) {
      OMNI_CHECK(disk_ && files, "expert '", units_[k]->name(),
                 "' has no host slab and no disk tier to read it from");
      disk_id_[k] = disk_->add(*units_[k], *files);
    }
    slot_bytes_ = std::max(slot_bytes_, units_[k]->bytes());
    key_by_name_.emplace(units_[k]->name(), static_cast<int>(k));
  }
  // Layers: parent module paths, numbered as they first come.
  std::unordered_map<std::string, int> layer_by_parent;
  layer_of_.resize(units_.size());
  for (size_t k = 0; k < units_.size(); ++k) {
    const std::string& name = units_[k]->name();
    const size_t dot = name.rfind('.');
    const std::string parent = dot == std::string::npos ? std::string() : name.substr(0, dot);
    auto it = layer_by_parent.emplace(parent, static_cast<int>(layer_by_parent.size())).first;
    layer_of_[k] = it->second;
  }
  layers_ = static_cast<int>(layer_by_parent.size());
  layer_tick_.assign(layers_, 0);
  if (disk_) disk_->prepare();  // pinned entries now, not in the first forward
  if (options_.miss_policy != ExpertMissPolicy::kHost || disk_) {
    OMNI_CHECK(options_.budget_bytes >= slot_bytes_, "expert_cache_budget (", options_.budget_bytes,
               " bytes) is smaller than one expert (", slot_bytes_, " bytes, '",
               units_.front()->name(), "'): raise it to at least ", slot_bytes_, " bytes");
  }
  // The host policy never copies an expert packed on the host to the device (a miss runs from
  // its slab, nothing is prefetched): no slots, no device memory. Experts on disk have no slab
  // to run from and are fetched whatever the policy: with a disk tier the budget's slots stay.
  const bool device_slots = options_.miss_policy != ExpertMissPolicy::kHost || disk_;
  const size_t count =
      device_slots ? std::min(units_.size(), options_.budget_bytes / slot_bytes_) : 0;
  entries_.resize(units_.size());
  predicted_mask_.assign(units_.size(), 0);
  slots_.resize(count);
  if (count > 0) pool_ = engine_->allocate_device(count * slot_bytes_);
  stats_.expert_bytes = slot_bytes_;
  stats_.experts = units_.size();
  stats_.slots = count;
  stats_.budget_bytes = options_.budget_bytes;
  stats_.device_bytes = count * slot_bytes_;
  log_debug("expert cache: ", units_.size(), " experts of ", slot_bytes_, " bytes, ", count,
            " device slots (budget ", options_.budget_bytes, " bytes), miss policy ",
            to_string(options_.miss_policy), ", eviction ", to_string(options_.eviction));
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

bool ExpertCache::evict_before(int a, int b) const {
  const Entry& ea = entries_[a];
  const Entry& eb = entries_[b];
  if (options_.eviction == ExpertEviction::kLayer) {
    // Stale: its layer asked since its last use and did not want it.
    const bool stale_a = ea.last_use < layer_tick_[layer_of_[a]];
    const bool stale_b = eb.last_use < layer_tick_[layer_of_[b]];
    if (stale_a != stale_b) return stale_a;
    if (!stale_a) {
      // Requests until its layer runs again: 1 for the next layer, layers_ for the current.
      auto distance = [&](int key) {
        return (layer_of_[key] - current_layer_ - 1 + 2 * layers_) % layers_ + 1;
      };
      const int da = distance(a), db = distance(b);
      if (da != db) return da > db;
    }
  }
  return ea.last_use < eb.last_use;
}

int ExpertCache::pick_victim(const std::vector<char>& protect) const {
  int best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const int key = slots_[s].key;
    if (key < 0) return static_cast<int>(s);
    if (protect[key]) continue;
    if (best < 0 || evict_before(key, slots_[best].key)) best = static_cast<int>(s);
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
  // Recorded after the victims were unbound: every compute that read their slots comes before.
  const Event readers_done = engine_->record_compute();
  // One copy for all, or with experts on disk, one per chunk of as many as the disk tier's
  // host entries can hold at once (each entry stays taken until its copy is over).
  const size_t chunk =
      disk_ && disk_->entries() > 0 ? disk_->entries() : std::max<size_t>(1, keys.size());
  Event ready;
  for (size_t first = 0; first < keys.size(); first += chunk) {
    const size_t last = std::min(keys.size(), first + chunk);
    std::vector<CopyOp> ops;
    std::vector<int> disk_ids;  // acquired from the disk tier, all at once: read side by side
    std::vector<size_t> disk_offsets;
    for (size_t i = first; i < last; ++i) {
      const int key = keys[i];
      const size_t offset = static_cast<size_t>(slots[i]) * slot_bytes_;
      if (disk_id_[key] < 0) {
        ops.push_back(units_[key]->copy_to(pool_, offset));
        continue;
      }
      disk_ids.push_back(disk_id_[key]);
      disk_offsets.push_back(offset);
    }
    std::vector<int> acquired;
    try {
      if (!disk_ids.empty()) {
        const auto disk_ops = disk_->copy_ops(disk_ids, pool_, disk_offsets);
        acquired = disk_ids;
        ops.insert(ops.end(), disk_ops.begin(), disk_ops.end());
      }
      ready = engine_->copy_async(ops, {readers_done});
    } catch (...) {
      for (int id : acquired) disk_->release(id, Event());
      throw;
    }
    for (int id : acquired) disk_->release(id, ready);
    for (size_t i = first; i < last; ++i) {
      Entry& e = entries_[keys[i]];
      e.slot = slots[i];
      e.ready = ready;
      e.waited = false;
      slots_[slots[i]].key = keys[i];
      stats_.loads += 1;
      stats_.bytes_h2d += units_[keys[i]]->bytes();
    }
  }
  return ready;
}

Event ExpertCache::copy_in_or_forget(const std::vector<int>& keys, const std::vector<int>& slots) {
  try {
    return copy_in(keys, slots);
  } catch (...) {
    // The slots taken for keys whose copy was never issued hold nothing: free them, so that
    // no slot claims an expert that is not there.
    for (int slot : slots) {
      const int key = slots_[slot].key;
      if (key >= 0 && entries_[key].slot != slot) slots_[slot].key = -1;
    }
    throw;
  }
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
  // An expert on disk has no host copy to compute from: it is fetched whatever the policy.
  if (disk_id_[key] >= 0) return true;
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
  const double link_bytes_per_ms = link_rate();
  if (link_bytes_per_ms <= 0) return true;  // measure the link first (ensure times the fetch)
  double host_flops_per_ms = host_ms_ > 0 ? host_flops_ / host_ms_ : options_.host_flops_hint / 1e3;
  if (host_flops_per_ms <= 0) return false;  // then measure the host once
  const double fetch_ms = static_cast<double>(unit.bytes()) / link_bytes_per_ms;
  const double host_ms = flops / host_flops_per_ms;
  return fetch_ms <= host_ms;
}

double ExpertCache::link_rate() const {
  const TransferCounters c = engine_->counters();
  if (c.copy_ms > 0 && c.bytes_h2d > 0) return static_cast<double>(c.bytes_h2d) / c.copy_ms;
  return probe_ms_ > 0 ? probe_bytes_ / probe_ms_ : 0.0;  // the engine times no copies
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
    layer_tick_[layer_of_[key]] = tick_;
  }
  if (!keys.empty()) {
    current_layer_ = layer_of_[keys.front()];
    // The pending prediction is scored over every ensure() of its layer (a prefill asks in
    // chunks), and closed by the first of another layer.
    if (current_layer_ == predicted_layer_) {
      for (int key : keys) {
        if (!predicted_mask_[key]) continue;
        predicted_mask_[key] = 0;
        ++predicted_used_;
      }
    } else {
      score_prediction();
    }
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
    // The auto policy with no link speed known (an engine that times no copies: CUDA without
    // OMNI_CUDA_TIMING) times this fetch on the host, once: the device idle first, so that
    // the copy alone is timed. Experts read from disk would time the disk instead: not those.
    bool probe = options_.miss_policy == ExpertMissPolicy::kAuto && link_rate() <= 0;
    double probe_bytes = 0;
    for (int key : misses) {
      probe = probe && disk_id_[key] < 0;
      probe_bytes += static_cast<double>(units_[key]->bytes());
    }
    if (probe) engine_->synchronize();
    const auto start = std::chrono::steady_clock::now();
    const Event ready = copy_in_or_forget(misses, miss_slots);
    if (probe) {
      ready.host_wait();
      const std::chrono::duration<double, std::milli> took =
          std::chrono::steady_clock::now() - start;
      probe_bytes_ += probe_bytes;
      probe_ms_ += std::max(took.count(), 1e-6);
    }
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

void ExpertCache::score_prediction() {
  if (predicted_layer_ < 0) return;
  for (int key : predicted_) predicted_mask_[key] = 0;
  stats_.prefetch_scored += predicted_.size();
  stats_.prefetch_scored_used += predicted_used_;
  window_predicted_ += predicted_.size();
  window_used_ += predicted_used_;
  predicted_.clear();
  predicted_layer_ = -1;
  predicted_used_ = 0;
  if (window_predicted_ < std::max<size_t>(options_.prefetch_window, 1)) return;
  prefetch_open_ = static_cast<double>(window_used_) >=
                   options_.prefetch_min_precision * static_cast<double>(window_predicted_);
  window_predicted_ = window_used_ = 0;
}

bool ExpertCache::prefetch_wanted(int key) {
  OMNI_CHECK(key >= 0 && static_cast<size_t>(key) < units_.size(), "expert key ", key,
             " out of range (", units_.size(), " experts)");
  if (predicted_layer_ >= 0 && layer_of_[key] != predicted_layer_) score_prediction();
  return prefetch_wanted();
}

bool ExpertCache::prefetch_wanted() {
  if (prefetch_open_ || options_.prefetch_min_precision <= 0) return true;
  const bool probe = gate_calls_++ % std::max(options_.prefetch_probe_every, 1) == 0;
  if (!probe) stats_.prefetch_skipped += 1;
  return probe;
}

size_t ExpertCache::prefetch(const std::vector<int>& keys) {
  score_prediction();  // the previous one, if its layer never ran
  if (slots_.empty()) return 0;
  std::vector<char> protect(units_.size(), 0);
  for (int key : current_) protect[key] = 1;
  // A closed gate's probe only scores: it marks the experts a prediction would have copied or
  // read ahead, and moves nothing. A probe that acted would cost the copies and disk reads the
  // gate was closed to save, for a prediction already known to miss more often than not.
  const bool score_only = !prefetch_open_ && options_.prefetch_min_precision > 0;
  std::vector<int> loads, load_slots, read_aheads, read_ahead_keys, would_act;
  for (int key : keys) {
    OMNI_CHECK(key >= 0 && static_cast<size_t>(key) < units_.size(), "expert key ", key,
               " out of range (", units_.size(), " experts)");
    if (protect[key]) continue;
    protect[key] = 1;
    Entry& e = entries_[key];
    if (e.slot >= 0) continue;  // on the device or arriving
    if (score_only) {
      would_act.push_back(key);
      continue;
    }
    if (disk_id_[key] >= 0 && !disk_->cached(disk_id_[key])) {
      // Not in host memory yet: start reading it (after the copies below have taken their
      // entries, so that a read cannot evict them), and leave the device copy to ensure(),
      // which then finds the bytes read (or being read) instead of waiting for the disk.
      read_aheads.push_back(disk_id_[key]);
      read_ahead_keys.push_back(key);
      continue;
    }
    if (options_.miss_policy == ExpertMissPolicy::kHost) continue;
    const int slot = pick_victim(protect);
    if (slot < 0) break;  // every slot holds an expert in use or asked for
    evict(slot);
    slots_[slot].key = key;
    loads.push_back(key);
    load_slots.push_back(slot);
  }
  if (!loads.empty()) copy_in_or_forget(loads, load_slots);
  for (int id : read_aheads) disk_->read_ahead(id);
  // What this prediction cost (copies, reads), scored by the next ensure() of its layer: the
  // predicted experts already on the device cost nothing and are not scored.
  for (const auto* acted : {&loads, &read_ahead_keys, &would_act}) {
    for (int key : *acted) {
      predicted_mask_[key] = 1;
      predicted_.push_back(key);
    }
  }
  if (!predicted_.empty()) predicted_layer_ = layer_of_[predicted_.front()];
  if (loads.empty()) return 0;
  ++tick_;
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
  ExpertCacheStats fresh;  // the gate's window stays: it describes the model, not a request
  fresh.expert_bytes = stats_.expert_bytes;
  fresh.experts = stats_.experts;
  fresh.slots = stats_.slots;
  fresh.budget_bytes = stats_.budget_bytes;
  fresh.device_bytes = stats_.device_bytes;
  stats_ = fresh;
  stall_.reset();
  if (disk_) disk_->reset_stats();
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
  const HostPlacement host = place_on_host(plan, config);
  std::unique_ptr<DiskTier> disk;
  if (host.experts_on_disk) {
    DiskTierOptions options;
    options.cache_bytes = host.expert_cache_bytes;
    options.min_entries = 2;
    options.reader_threads = config.disk_reader_threads;
    options.pin = config.pin_memory;
    options.label = "expert disk tier";
    options.read = config.disk_read;
    disk = std::make_unique<DiskTier>(engine, options);
  }
  std::vector<std::unique_ptr<OffloadUnit>> units;
  units.reserve(plan.experts.size());
  size_t total = 0, on_disk = 0;
  for (const auto& expert : plan.experts) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : expert.tensor_names) {
      auto it = table.find(name);
      OMNI_CHECK(it != table.end(), "tensor '", name,
                 "' disappeared from the model since planning");
      tensors.emplace_back(name, it->second);
    }
    OMNI_CHECK(!tensors.empty(), "expert module '", expert.name, "' holds no tensors");
    if (disk) {
      if (auto unit = DiskTier::leave_on_disk(expert.name, tensors, &config.convert_dtypes,
                                              config.disk_files, config.disk_read)) {
        total += unit->bytes();
        units.push_back(std::move(unit));
        ++on_disk;
        continue;
      }
    }
    units.push_back(std::make_unique<OffloadUnit>(expert.name, tensors, *engine, config.pin_memory,
                                                  &config.convert_dtypes));
    total += units.back()->bytes();
  }
  if (disk && on_disk < units.size()) {
    log_info("expert disk tier: ", units.size() - on_disk,
             " experts have tensors outside the checkpoint files and were packed on the host");
  }
  ExpertCacheOptions options;
  options.miss_policy = config.expert_miss_policy;
  options.eviction = config.expert_eviction;
  options.prefetch_min_precision = config.expert_prefetch_min_precision;
  options.budget_bytes = config.expert_cache_budget_bytes;
  if (options.budget_bytes == 0) {
    options.budget_bytes =
        static_cast<size_t>(config.expert_cache_budget_fraction * static_cast<double>(total));
  }
  if (on_disk == 0) disk.reset();
  return std::make_unique<ExpertCache>(std::move(units), std::move(engine), options,
                                       std::move(disk), &config.disk_files);
}

}  // namespace omni::offload
