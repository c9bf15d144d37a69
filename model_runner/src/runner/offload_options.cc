#include "model_runner/runner/offload_options.h"

namespace omni::models {

std::pair<offload::OffloadConfig, offload::ModelSpec> offload_setup(
    const RunnerOffloadOptions& o, const std::string& thinker_prefix, bool talker,
    const std::function<std::vector<std::string>(const std::vector<std::string>&)>&
        component_paths) {
  offload::OffloadConfig oc;
  offload::ModelSpec spec;
  const std::string& t = thinker_prefix;
  oc.pin_memory = o.pin_memory;
  if (o.layerwise) {
    oc.layerwise = true;
    oc.num_gpu_layers = o.num_gpu_layers;
    spec.dits = {t + "model"};
    spec.block_lists = {{t + "model.layers", {}}};
    if (talker) {
      spec.dits.push_back("talker.model");
      spec.block_lists.push_back({"talker.model.layers", {}});
    }
    if (o.layerwise_encoders) {
      spec.dits.insert(spec.dits.end(), {t + "audio_tower", t + "visual"});
      spec.block_lists.push_back({t + "audio_tower.layers", {}});
      spec.block_lists.push_back({t + "visual.blocks", {}});
    }
  } else if (o.cpu_offload_enabled) {
    oc.component = true;
    oc.components = component_paths(o.components);
    oc.component_policy = offload::parse_component_policy(o.strategy);
    oc.device_budget_bytes = o.device_budget_bytes;
    oc.device_budget_fraction = o.device_budget_fraction;
  }
  if (o.cpu_offload_experts) {
    oc.expert_modules = {t + "model.layers.*.mlp.experts.*"};
    if (o.expert_prefetch) oc.resident_modules = {t + "model.layers.*.mlp.gate"};
    oc.expert_cache_budget_bytes = o.expert_cache_budget_bytes;
    oc.expert_cache_budget_fraction = o.expert_cache_budget_fraction;
    oc.expert_miss_policy = offload::parse_expert_miss_policy(o.expert_miss_policy);
    oc.expert_eviction = offload::parse_expert_eviction(o.expert_eviction);
  }
  oc.host_memory_budget_bytes = o.host_memory_budget_bytes;
  oc.disk_read_ahead = o.disk_read_ahead;
  oc.disk_reader_threads = o.disk_reader_threads;
  oc.disk_read = offload::parse_disk_read(o.disk_read);
  oc.validate();
  return {oc, spec};
}

}  // namespace omni::models
