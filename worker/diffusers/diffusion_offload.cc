#include "worker/diffusers/diffusion_offload.h"

#include "cpu_offload/check.h"

namespace omni::pipeline::local {

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

}  // namespace omni::pipeline::local
