// Expert-level offload for mixture-of-experts models: a device cache of experts.
//
// Each expert is an offload unit of its own (one host slab, packed at setup, originals
// released). The device holds a pool of equal slots, as many as a byte budget allows (every
// expert of a model has the same size; a budget below one expert is an error). A model calls
// ensure() with the experts its router chose, once per MoE layer, before they run:
//   - hits (on the device, or on their way from a prefetch) only refresh their last use;
//   - misses take slots not in the current request, chosen by the eviction policy: the victims
//     are unbound, then every miss is copied in ONE copy_async group ordered after a compute
//     event recorded after the victims' last use, compute waits for it, and the misses are bound.
// Eviction (ExpertEviction): `lru`, or `layer` (the default). A decoder asks for its MoE layers
// in the same order token after token: a cyclic scan, for which LRU is the worst policy once a
// token's experts outnumber the slots (what it evicts is always what is needed soonest, so
// every use misses). `layer` evicts first the experts their layer's last request passed over
// (stale), oldest first; then, approximating Belady's optimal policy for a cycle, the expert
// whose layer runs last counting from the current one (the layer that just ran). An expert's
// layer is its parent module (`model.layers.3.mlp.experts` for `...experts.17`), numbered in
// the order the units come, which is the order the layers run.
// prefetch() does the same for experts a model expects to need soon, without waiting: the
// ensure() that uses them waits (on the device, not the host). Model-agnostic: keys are unit
// indices, found by module path with key_of().
//
// A prediction pays only when it is right: a wrong one costs a copy (or a disk read) and
// evicts an expert that may have hit, and the prediction itself costs the model a router
// product and a device-to-host sync per layer. The cache scores what each prefetch() acted on
// (the experts it copied or read ahead; those already on the device cost nothing) against the
// next ensure() of the predicted layer: the fraction it asked for. Once a window of
// prefetch_window scored experts is below prefetch_min_precision, prefetch_wanted() tells the
// model to stop predicting, except one call in prefetch_probe_every, whose predictions keep
// the score current: prefetch resumes as soon as a window scores at least the minimum. While
// the gate is closed, prefetch() only scores (the probes copy and read nothing).
//
// Miss policy `host` (ExpertMissPolicy, offload_config.h): a miss is not fetched but bound to
// views of its host slab, and the model computes it where it lies (the host CPU), as llama.cpp's
// --cpu-moe does for every expert and Fiddler per expert; nothing is copied or prefetched, so
// the cache then holds no device slots (the budget is not allocated). `auto` picks, per miss,
// whichever the measured link bandwidth and host compute rate say is faster: the link's from the
// engine's copy timings, or where the engine times no copies (CUDA without OMNI_CUDA_TIMING)
// from one fetch the cache times itself on the host; the host's from the experts it computed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_offload/disk_tier.h"
#include "cpu_offload/offload_config.h"
#include "cpu_offload/offload_plan.h"
#include "cpu_offload/transfer_engine.h"
#include "cpu_offload/weight_store.h"

namespace omni::offload {

struct ExpertCacheStats {
  uint64_t requests = 0;       // ensure() calls
  uint64_t hits = 0;           // experts asked for that were on the device or arriving
  uint64_t misses = 0;         // experts asked for that were not (fetched or host-computed)
  uint64_t host_computed = 0;  // misses computed from the host slab (miss policy host/auto)
  uint64_t prefetched = 0;     // experts copied by prefetch()
  uint64_t prefetch_hits = 0;  // prefetched experts that a later ensure() used
  // Experts a prefetch() copied or read ahead (the predicted ones it acted on), scored by
  // the next ensure() of their layer, and how many that ensure() asked for.
  uint64_t prefetch_scored = 0;
  uint64_t prefetch_scored_used = 0;
  uint64_t prefetch_skipped = 0;  // prefetch_wanted() calls answered no (the gate, below)
  uint64_t loads = 0;             // copies of experts to the device (fetched misses + prefetched)
  uint64_t evictions = 0;         // experts that left the device to make room
  uint64_t bytes_h2d = 0;         // loads x expert bytes
  double stall_ms = 0;            // time compute waited for expert copies
  size_t expert_bytes = 0;        // one expert's slab (the slot size)
  size_t experts = 0;             // experts under the cache
  size_t slots = 0;               // device slots: budget / expert_bytes, at most `experts`
  size_t budget_bytes = 0;        // the budget asked for
  size_t device_bytes = 0;        // slots x expert_bytes (<= budget_bytes)

  uint64_t uses() const { return hits + misses; }
  double hit_rate() const { return uses() ? static_cast<double>(hits) / uses() : 0.0; }
  // Of the prefetched experts, the fraction used before being evicted.
  double prefetch_hit_rate() const {
    return prefetched ? static_cast<double>(prefetch_hits) / prefetched : 0.0;
  }
  // Of the experts prefetch() acted on, the fraction their layer asked for.
  double prefetch_precision() const {
    return prefetch_scored ? static_cast<double>(prefetch_scored_used) / prefetch_scored : 0.0;
  }
  std::string to_json() const;
};

struct ExpertCacheOptions {
  size_t budget_bytes = 0;  // device bytes for expert slots; must hold at least one expert
  ExpertMissPolicy miss_policy = ExpertMissPolicy::kFetch;
  ExpertEviction eviction = ExpertEviction::kLayer;
  // Auto policy: host compute rate (FLOP/s) when nothing was measured yet (0: fetch until a
  // host computation was measured).
  double host_flops_hint = 0;
  // Prefetch gate (see the class comment): the least precision of a window of
  // `prefetch_window` scored experts for prefetch_wanted() to say yes (0: always yes), and
  // while it says no, one call in `prefetch_probe_every` says yes.
  double prefetch_min_precision = 0.5;
  size_t prefetch_window = 128;
  int prefetch_probe_every = 8;
};

class ExpertCache {
 public:
  // Where an expert runs after ensure().
  enum class Placement { kDevice, kHost };

  // Packed units (host slabs) of equal size. Throws omni::Error when the budget cannot hold
  // one expert. With `disk`, units without a host slab (layout-only, DiskTier::readable in
  // `files`) are read from the checkpoint's files through it when they are fetched.
  ExpertCache(std::vector<std::unique_ptr<OffloadUnit>> units,
              std::shared_ptr<TransferEngine> engine, const ExpertCacheOptions& options,
              std::unique_ptr<DiskTier> disk = nullptr, const TensorFiles* files = nullptr);
  // Waits for copies in flight, then unbinds every expert (the model is unusable afterwards).
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // The key of the unit at module path `name`; -1 when there is none.
  int key_of(const std::string& name) const;
  size_t size() const { return units_.size(); }
  const OffloadUnit& unit(int key) const { return *units_.at(key); }
  size_t slots() const { return slots_.size(); }
  size_t expert_bytes() const { return slot_bytes_; }
  // The MoE layer of `key` in run order (see Eviction above), and how many there are.
  int layer_of(int key) const { return layer_of_.at(key); }
  int layers() const { return layers_; }
  const ExpertCacheOptions& options() const { return options_; }

  // Makes `keys` (distinct, at most slots()) usable by compute: bound to device slots, or with
  // the host miss policy, misses bound to their host slabs. `rows` (tokens per key, optional)
  // feeds the auto policy. Returns each key's placement.
  std::vector<Placement> ensure(const std::vector<int>& keys,
                                const std::vector<int64_t>& rows = {});
  // Starts copies of those of `keys` not on the device, into slots that hold neither the last
  // ensure()'s keys nor earlier keys of this call, as many as there are such slots; does not
  // wait. Returns the number of copies issued. While the prefetch gate is closed, it only
  // scores `keys` (no copies, no disk reads) and returns 0.
  size_t prefetch(const std::vector<int>& keys);
  // Whether a model should predict its next layer's experts and prefetch() them now: yes
  // until a window of scored experts is below options().prefetch_min_precision, then one call
  // in prefetch_probe_every until a window scores at least that again.
  bool prefetch_wanted();
  // The same, asked before an ensure() of `key`'s layer: a pending prediction of another layer
  // is over, and is scored first as that ensure() would score it, so that the answer does not
  // depend on asking before or after the ensure().
  bool prefetch_wanted(int key);
  // Host-computation time of `flops` floating-point operations that took `ms` (the model
  // reports it for host-placed experts; the auto policy reads the rate).
  void record_host_compute(double flops, double ms);

  // Waits for outstanding work (timings resolve), then reports.
  ExpertCacheStats stats();
  void reset_stats();  // the disk tier's too
  // Unbinds every expert and forgets the device copies (slots stay allocated); returns 0
  // bytes freed as the pool is kept. For a stage that must stop using the weights.
  void clear();
  // The disk tier the experts are read through; null when they are packed on the host.
  const DiskTier* disk() const { return disk_.get(); }

 private:
  struct Entry {
    int slot = -1;            // device slot held or arriving; -1 when not on the device
    Event ready;              // its copy
    bool waited = false;      // compute waited for `ready`
    bool prefetched = false;  // arrived by prefetch and not used since
    bool host_bound = false;  // bound to its host slab (miss policy host)
    uint64_t last_use = 0;
  };
  struct Slot {
    int key = -1;
  };

  // A slot for a new copy, not holding any of `protect`; -1 when none.
  int pick_victim(const std::vector<char>& protect) const;
  // Whether `a` should leave before `b` (both on the device), by the eviction policy.
  bool evict_before(int a, int b) const;
  // Empties `slot` (unbinding its expert) for `key`.
  void evict(int slot);
  // Issues one copy of `keys` into `slots`, ordered after the compute that last read them.
  Event copy_in(const std::vector<int>& keys, const std::vector<int>& slots);
  // copy_in, and when it throws (a failed disk read), the slots it did not fill made free.
  Event copy_in_or_forget(const std::vector<int>& keys, const std::vector<int>& slots);
  void bind_host(int key);
  void unbind_host_bound();
  bool fetch_is_faster(int key, int64_t rows) const;
  // Scores the pending prediction (prefetch()'s keys) and adds it to the window.
  void score_prediction();
  // Link bytes per ms: the engine's copy timings, else the cache's own timed fetch; 0 unknown.
  double link_rate() const;

  std::shared_ptr<TransferEngine> engine_;
  ExpertCacheOptions options_;
  std::vector<std::unique_ptr<OffloadUnit>> units_;
  std::unordered_map<std::string, int> key_by_name_;
  std::vector<Entry> entries_;
  std::vector<Slot> slots_;
  size_t slot_bytes_ = 0;
  DeviceBuffer pool_;
  std::unique_ptr<DiskTier> disk_;
  std::vector<int> disk_id_;  // key -> id in disk_, -1 when packed on the host
  std::vector<int> current_;  // keys of the last ensure()
  std::vector<int> host_bound_;
  uint64_t tick_ = 0;
  std::vector<int> layer_of_;  // key -> MoE layer in run order
  int layers_ = 0;
  std::vector<uint64_t> layer_tick_;  // layer -> tick of its last ensure()
  int current_layer_ = 0;             // the layer of the last ensure()
  ExpertCacheStats stats_;
  TimeAccumulator stall_;
  double host_flops_ = 0, host_ms_ = 0;
  double probe_bytes_ = 0, probe_ms_ = 0;  // auto policy: fetches timed on the host
  // The prefetch gate: the last prefetch()'s scored keys (marked in predicted_mask_ until
  // their layer asks for them), how many it asked for, and the window being filled.
  std::vector<int> predicted_;
  std::vector<char> predicted_mask_;
  int predicted_layer_ = -1;
  size_t predicted_used_ = 0;
  size_t window_predicted_ = 0, window_used_ = 0;
  bool prefetch_open_ = true;  // the last full window scored at least the minimum
  uint64_t gate_calls_ = 0;    // prefetch_wanted() calls while closed
};

// Packs the plan's experts (OffloadPlan::experts) of `root` into an ExpertCache under
// `config` (expert_cache_budget_bytes, or expert_cache_budget_fraction of all experts' bytes;
// expert_miss_policy). Null when the plan has no experts. Tensors named in
// config.convert_dtypes are converted while packing. Under a host memory budget they do not
// fit (place_on_host, disk_tier.h), the experts stay in the checkpoint's files and are read
// through a disk tier whose host entries are a second, larger cache level below the device's.
std::unique_ptr<ExpertCache> make_expert_cache(torch::nn::Module& root, const OffloadPlan& plan,
                                               const OffloadConfig& config,
                                               std::shared_ptr<TransferEngine> engine);

}  // namespace omni::offload
