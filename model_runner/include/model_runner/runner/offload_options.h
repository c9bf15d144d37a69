// Offload of a Qwen3-Omni runner, with the names of the stage config (vLLM-Omni's keys), and
// how they become the engine's OffloadConfig and ModelSpec. Shared by the runners of each stage
// (thinker, talker, code2wav).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/model_spec.h"
#include "cpu_offload/offload_config.h"

namespace omni::models {

struct RunnerOffloadOptions {
  // cpu_offload_enabled: component offload of `components`.
  bool cpu_offload_enabled = false;
  // cpu_offload_components: module names or globs as the checkpoint names them (each runner
  // documents its names: thinker_stage_component_names, talker_stage_component_paths).
  std::vector<std::string> components = {"visual", "audio_tower"};
  // cpu_offload_strategy: "alternating" (the component about to run comes on, others leave as
  // the budget requires) or "sequential" (each leaves right after its forward).
  std::string strategy = "alternating";
  // cpu_offload_pin_memory.
  bool pin_memory = true;
  // Device bytes the offloaded components may hold together (alternating); 0 = no budget
  // (a component leaves when another comes on). Or a fraction of device memory.
  size_t device_budget_bytes = 0;
  double device_budget_fraction = 0;
  // Layerwise streaming of the decoder layers (the thinker's, and the talker's when loaded),
  // for language models that do not fit; window of num_gpu_layers layers ahead. Replaces
  // component offload when set.
  bool layerwise = false;
  int num_gpu_layers = 1;
  // With layerwise: the audio tower's layers and the vision encoder's blocks stream through the
  // same slots (their convolutions, position tables and mergers stay resident), so the encoders
  // leave the device too. They run once per request, so this costs one copy of each.
  bool layerwise_encoders = true;
  // cpu_offload_experts: the thinker's MoE experts (model.layers.*.mlp.experts.*) become
  // offload units of their own in a device expert cache (cpu_offload/expert_cache.h); the rest
  // of each layer follows the strategy above (resident, component or layerwise).
  bool cpu_offload_experts = false;
  // expert_cache_budget: device bytes of the expert cache, or (when 0) a fraction of all
  // experts' bytes ("25%" in the CLI and YAML: parse_expert_cache_budget, expert_offload.h).
  size_t expert_cache_budget_bytes = 0;
  double expert_cache_budget_fraction = 0.25;
  // expert_prefetch: each MoE layer predicts the next one's experts with the next router
  // (kept resident) and prefetches them.
  bool expert_prefetch = true;
  // expert_miss_policy: fetch | host | auto (offload::ExpertMissPolicy).
  std::string expert_miss_policy = "fetch";
  // expert_eviction: lru | layer (offload::ExpertEviction; layer: by the layers' run order).
  std::string expert_eviction = "layer";
  // host_memory_budget: host bytes the streamed weights (layerwise layers, experts) may take;
  // 0 = no limit. Beyond it they are read from the checkpoint's files when needed (the disk
  // tier, cpu_offload/disk_tier.h). The checkpoint must be safetensors files on a local disk.
  size_t host_memory_budget_bytes = 0;
  // disk_read_ahead: layerwise units read ahead of need beyond the device window.
  int disk_read_ahead = 2;
  // disk_reader_threads: threads of each disk tier that read (OffloadConfig's).
  int disk_reader_threads = 2;
  // disk_read: "pread" (our bounded pinned cache, reader threads, read-ahead) or "mmap" (copies
  // from the file's mapping; the OS page cache is the only cache, as llama.cpp's loading).
  std::string disk_read = "pread";
};

// The engine's view of `options` for a root holding the thinker at `thinker_prefix` ("" or
// "thinker.") and, with `talker`, "talker.model.layers". `component_paths` maps the user's
// component names onto module paths. Validates the config (throws naming the bad value).
std::pair<offload::OffloadConfig, offload::ModelSpec> offload_setup(
    const RunnerOffloadOptions& options, const std::string& thinker_prefix, bool talker,
    const std::function<std::vector<std::string>(const std::vector<std::string>&)>&
        component_paths);

}  // namespace omni::models
