#include "cpu_offload/offload_config.h"

#include <cmath>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"

namespace omni::offload {

Strategy parse_strategy(const std::string& text) {
  if (text == "none") return Strategy::kNone;
  if (text == "model" || text == "model-level" || text == "model_level") {
    return Strategy::kModelLevel;
  }
  if (text == "layerwise" || text == "layer" || text == "blockwise") return Strategy::kLayerwise;
  if (text == "component") return Strategy::kComponent;
  OMNI_THROW("unknown offload strategy '", text,
             "' (expected none, model, layerwise or component)");
}

Granularity parse_granularity(const std::string& text) {
  if (text == "block") return Granularity::kBlock;
  if (text == "phase") return Granularity::kPhase;
  OMNI_THROW("unknown offload granularity '", text, "' (expected block or phase)");
}

ComponentPolicy parse_component_policy(const std::string& text) {
  if (text == "alternating") return ComponentPolicy::kAlternating;
  if (text == "sequential") return ComponentPolicy::kSequential;
  OMNI_THROW("unknown component offload strategy '", text, "' (expected ",
             names::listed(names::component_policies()), ")");
}

DiskRead parse_disk_read(const std::string& text) {
  if (text == "pread") return DiskRead::kPread;
  if (text == "mmap") return DiskRead::kMmap;
  OMNI_THROW("unknown disk read mode '", text, "' (expected ", names::listed(names::disk_reads()),
             ")");
}

std::string to_string(DiskRead read) { return read == DiskRead::kMmap ? "mmap" : "pread"; }

ExpertEviction parse_expert_eviction(const std::string& text) {
  if (text == "lru") return ExpertEviction::kLru;
  if (text == "layer") return ExpertEviction::kLayer;
  OMNI_THROW("unknown expert_eviction '", text, "' (expected ",
             names::listed(names::expert_evictions()), ")");
}

std::string to_string(ExpertEviction eviction) {
  return eviction == ExpertEviction::kLru ? "lru" : "layer";
}

ExpertMissPolicy parse_expert_miss_policy(const std::string& text) {
  if (text == "fetch") return ExpertMissPolicy::kFetch;
  if (text == "host") return ExpertMissPolicy::kHost;
  if (text == "auto") return ExpertMissPolicy::kAuto;
  OMNI_THROW("unknown expert_miss_policy '", text, "' (expected ",
             names::listed(names::expert_miss_policies()), ")");
}

std::string to_string(ExpertMissPolicy policy) {
  switch (policy) {
    case ExpertMissPolicy::kFetch:
      return "fetch";
    case ExpertMissPolicy::kHost:
      return "host";
    case ExpertMissPolicy::kAuto:
      return "auto";
  }
  return "?";
}

std::string to_string(ComponentPolicy policy) {
  return policy == ComponentPolicy::kSequential ? "sequential" : "alternating";
}

std::string to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kNone:
      return "none";
    case Strategy::kModelLevel:
      return "model";
    case Strategy::kLayerwise:
      return "layerwise";
    case Strategy::kComponent:
      return "component";
  }
  return "?";
}

std::string to_string(Granularity granularity) {
  return granularity == Granularity::kPhase ? "phase" : "block";
}

OffloadConfig OffloadConfig::for_strategy(Strategy strategy) {
  OffloadConfig config;
  config.model_level = strategy == Strategy::kModelLevel;
  config.layerwise = strategy == Strategy::kLayerwise;
  config.component = strategy == Strategy::kComponent;
  return config;
}

Strategy OffloadConfig::strategy() const {
  const int enabled = int{model_level} + int{layerwise} + int{component};
  const Strategy chosen = layerwise     ? Strategy::kLayerwise
                          : component   ? Strategy::kComponent
                          : model_level ? Strategy::kModelLevel
                                        : Strategy::kNone;
  if (enabled > 1) {
    log_info("several offload strategies are enabled: ", to_string(chosen),
             " wins (precedence: layerwise, component, model-level)");
  }
  return chosen;
}

void OffloadConfig::validate() const {
  OMNI_CHECK(staging_bytes >= 4096, "staging_bytes must be >= 4096, got ", staging_bytes);
  OMNI_CHECK(num_gpu_layers >= 1, "num_gpu_layers must be >= 1, got ", num_gpu_layers);
  OMNI_CHECK(std::isfinite(offload_ratio) && offload_ratio >= 0.0 && offload_ratio <= 1.0,
             "offload_ratio must be in [0, 1], got ", offload_ratio);
  OMNI_CHECK(std::isfinite(device_budget_fraction) && device_budget_fraction >= 0.0 &&
                 device_budget_fraction <= 1.0,
             "device_budget_fraction must be in [0, 1], got ", device_budget_fraction);
  OMNI_CHECK(!component || !components.empty(),
             "component offload is enabled but no components are listed (e.g. visual, "
             "audio_tower)");
  OMNI_CHECK(std::isfinite(expert_cache_budget_fraction) && expert_cache_budget_fraction >= 0.0 &&
                 expert_cache_budget_fraction <= 1.0,
             "expert_cache_budget as a fraction of the experts' bytes must be in [0, 1], got ",
             expert_cache_budget_fraction);
  OMNI_CHECK(
      expert_modules.empty() || expert_cache_budget_bytes > 0 || expert_cache_budget_fraction > 0,
      "expert offload is enabled but expert_cache_budget is 0");
  OMNI_CHECK(disk_read_ahead >= 0, "disk_read_ahead must be >= 0, got ", disk_read_ahead);
  OMNI_CHECK(disk_reader_threads >= 1 && disk_reader_threads <= 64,
             "disk_reader_threads must be in [1, 64], got ", disk_reader_threads);
}

}  // namespace omni::offload
