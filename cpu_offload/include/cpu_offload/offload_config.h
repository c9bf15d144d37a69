// What the user asks of the engine. Parsed at the edges (CLI, YAML) into this struct; the names
// each parse_*() accepts are listed in option_names.h for the front ends that check them first.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace omni::offload {

enum class Strategy { kNone, kModelLevel, kLayerwise, kComponent };
enum class Granularity { kBlock, kPhase };
// Component offload: when offloaded components leave the device.
enum class ComponentPolicy {
  kAlternating,  // when another one needs the room (all others at once without a budget)
  kSequential,   // right after each of its forwards
};

Strategy parse_strategy(const std::string& text);        // none | model | layerwise | component
Granularity parse_granularity(const std::string& text);  // block | phase
ComponentPolicy parse_component_policy(const std::string& text);  // alternating | sequential
// Expert offload: what a miss in the device expert cache does (expert_cache.h).
enum class ExpertMissPolicy {
  kFetch,  // copy the expert to the device
  kHost,   // compute it from its host slab on the host CPU
  kAuto,   // whichever measured link bandwidth and host compute rate say is faster
};
ExpertMissPolicy parse_expert_miss_policy(const std::string& text);  // fetch | host | auto
std::string to_string(ExpertMissPolicy policy);
// Expert offload: which expert leaves a full device expert cache (expert_cache.h).
enum class ExpertEviction {
  kLru,    // the least recently used
  kLayer,  // experts its layer passed over first, then the one whose layer runs last from now
};
ExpertEviction parse_expert_eviction(const std::string& text);  // layer | lru
std::string to_string(ExpertEviction eviction);
std::string to_string(Strategy strategy);
std::string to_string(Granularity granularity);
std::string to_string(ComponentPolicy policy);

// Where a tensor's bytes lie in a file (a safetensors shard), as the file stores them.
struct TensorFileExtent {
  std::string path;
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t bytes = 0;
  at::ScalarType dtype = at::kFloat;
};
// By the tensor's dotted name from the root module apply_offload is given.
using TensorFiles = std::unordered_map<std::string, TensorFileExtent>;

// How the disk tier reads: pread into its own bounded cache of pinned host entries, or
// copies straight from the files' mappings, leaving the caching to the OS page cache (as
// llama.cpp's mmap loading does; for comparison: pageable sources, no bound of our own).
enum class DiskRead { kPread, kMmap };
DiskRead parse_disk_read(const std::string& text);  // pread | mmap
std::string to_string(DiskRead read);

struct OffloadConfig {
  // Model-level offload (vLLM-Omni's "cpu offload"): component groups in mutual exclusion.
  bool model_level = false;
  // Layerwise offload: stream the DiT's blocks through a window of device slots.
  bool layerwise = false;
  // Component offload for AR models (the thinker's visual / audio_tower, ...): the matched
  // components come to the device when called and leave by `component_policy`.
  bool component = false;
  // Keep host slabs in pinned memory (faster, overlappable copies).
  bool pin_memory = true;

  // Layerwise: units on the device ahead of the one computing (the window depth).
  int num_gpu_layers = 1;
  // Layerwise: a unit is a whole block, or a phase of one (attention, cross-attention, FFN).
  Granularity granularity = Granularity::kBlock;
  // Layerwise: fraction of each block list that is streamed (the first blocks); the rest stays
  // resident. 1 streams every block.
  double offload_ratio = 1.0;

  // Model-level: the VAE joins the mutual exclusion instead of staying resident.
  bool strict_vae = false;
  // Component: dotted module paths; a '*' or '?' matches within one path segment
  // ("visual", "audio_tower", "thinker.*"). Nested matches belong to the outermost.
  std::vector<std::string> components;
  ComponentPolicy component_policy = ComponentPolicy::kAlternating;

  // Device bytes the weights may use (0: no budget).
  //   model-level: when the current group, the next one and the resident weights fit, the
  //     next group is copied while the current one computes; 0 keeps strict exclusion.
  //   component (alternating): components stay on the device until a load would exceed it,
  //     then the least recently used ones leave; 0 makes every other component leave.
  size_t device_budget_bytes = 0;
  // Component: the budget as a fraction of the device's memory (used when > 0 and no byte
  // budget is set).
  double device_budget_fraction = 0;

  // Weights to convert while packing, by dotted name from the root module: the dtype the
  // model wants for each. A loader that leaves weights in the checkpoint's dtype and names
  // them here never holds a converted copy of the whole model (weight_store.h).
  std::unordered_map<std::string, at::ScalarType> convert_dtypes;
  // Pinned host memory through which resident weights go to the device (two halves used in
  // turn): the most host memory loading resident weights takes beyond the checkpoint itself.
  size_t staging_bytes = size_t{64} << 20;

  // Expert-level offload (MoE): modules matched by these dotted patterns ('*' within a
  // segment, e.g. "model.layers.*.mlp.experts.*") are carved out of whatever the strategy
  // places: each becomes a unit of its own in a device expert cache (expert_cache.h, made by
  // make_expert_cache from OffloadPlan::experts). The rest of each layer follows the strategy.
  std::vector<std::string> expert_modules;
  // Modules kept resident whatever the strategy (same patterns), e.g. the routers a next-layer
  // expert prediction reads while their layer is not on the device.
  std::vector<std::string> resident_modules;
  // Device bytes of the expert cache; 0: expert_cache_budget_fraction of all experts' bytes.
  size_t expert_cache_budget_bytes = 0;
  // The budget as a fraction of all experts' bytes (used when no byte budget is set).
  double expert_cache_budget_fraction = 0.25;
  ExpertMissPolicy expert_miss_policy = ExpertMissPolicy::kFetch;
  ExpertEviction expert_eviction = ExpertEviction::kLayer;
  // Prefetch only while its predictions are used (ExpertCacheOptions::prefetch_min_precision):
  // below this fraction of predicted experts asked for, the model stops predicting except one
  // layer call in eight. 0: always predict.
  double expert_prefetch_min_precision = 0.5;

  // The disk tier (disk_tier.h). Host bytes the streamed weights (layerwise units and experts)
  // may take; 0: no limit. When they do not fit, experts (then layerwise units too, if need be)
  // are read on demand from the checkpoint's files, at the places given in disk_files, into a
  // bounded host cache instead of being packed into host slabs.
  size_t host_memory_budget_bytes = 0;
  TensorFiles disk_files;
  // Units read ahead of need (layerwise: beyond the device window), and reader threads.
  int disk_read_ahead = 2;
  int disk_reader_threads = 2;
  DiskRead disk_read = DiskRead::kPread;

  static OffloadConfig for_strategy(Strategy strategy);
  // The strategy that runs; when several are enabled: layerwise, then component, then
  // model-level (logged).
  Strategy strategy() const;
  // Throws omni::Error naming the bad field and value.
  void validate() const;
};

}  // namespace omni::offload
