#include "worker/diffusers/diffusion_stage_common.h"

#include "cpu_offload/check.h"
#include "model_runner/runner/diffusion_request.h"
#include "worker/diffusers/diffusion_params.h"

namespace omni::pipeline {

const std::vector<std::string>& diffusion_ignored_keys(bool batched) {
  static const std::vector<std::string> batching = {"cpu_offload_experts",
                                                    "expert_cache_budget",
                                                    "expert_prefetch",
                                                    "expert_miss_policy",
                                                    "expert_eviction",
                                                    "host_memory_budget",
                                                    "disk_read",
                                                    "max_num_batched_tokens",
                                                    "block_size",
                                                    "kv_cache_memory_bytes",
                                                    "enable_chunked_prefill"};
  static const std::vector<std::string> one_at_a_time = [] {
    auto keys = batching;
    keys.push_back("max_num_seqs");
    return keys;
  }();
  return batched ? batching : one_at_a_time;
}

std::shared_ptr<const StageParams> diffusion_stage_params(const Request& request, bool) {
  DiffusionParams p;
  p.prompt = request.chat.text;
  p.request = request.parts.value<models::DiffusionRequest>();
  return std::make_shared<const DiffusionParams>(std::move(p));
}

StagePacket diffusion_step_packet(int64_t index, int64_t total, double timestep, double step_ms) {
  StagePacket p;
  p.metrics = {{"step", static_cast<double>(index + 1)},
               {"steps", static_cast<double>(total)},
               {"timestep", timestep},
               {"step_ms", step_ms}};
  return p;
}

namespace local {

offload::OffloadConfig diffusion_offload_config(const LocalStageOptions& o) {
  OMNI_CHECK(!o.offload.cpu_offload_enabled, o.name,
             ": cpu_offload_enabled (component offload) does not apply to a diffusion ",
             "stage; use enable_cpu_offload (model-level) or enable_layerwise_offload");
  OMNI_CHECK(!(o.offload_stage && o.offload.layerwise), o.name,
             ": enable_cpu_offload and enable_layerwise_offload exclude each other");
  auto strategy = offload::Strategy::kNone;
  if (o.offload_stage) strategy = offload::Strategy::kModelLevel;
  if (o.offload.layerwise) strategy = offload::Strategy::kLayerwise;
  auto config = offload::OffloadConfig::for_strategy(strategy);
  config.pin_memory = o.offload.pin_memory;
  if (o.offload.layerwise) config.num_gpu_layers = o.offload.num_gpu_layers;
  return config;
}

}  // namespace local
}  // namespace omni::pipeline
