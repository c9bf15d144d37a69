#include "cpu_offload/offload_config.h"

#include <cmath>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload {

Strategy parse_strategy(const std::string& text) {
  if (text == "none") return Strategy::kNone;
  if (text == "model" || text == "model-level" || text == "model_level") {
    return Strategy::kModelLevel;
  }
  if (text == "layerwise" || text == "layer" || text == "blockwise") return Strategy::kLayerwise;
  OMNI_THROW("unknown offload strategy '", text, "' (expected none, model or layerwise)");
}

Granularity parse_granularity(const std::string& text) {
  if (text == "block") return Granularity::kBlock;
  if (text == "phase") return Granularity::kPhase;
  OMNI_THROW("unknown offload granularity '", text, "' (expected block or phase)");
}

std::string to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kNone:
      return "none";
    case Strategy::kModelLevel:
      return "model";
    case Strategy::kLayerwise:
      return "layerwise";
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
  return config;
}

Strategy OffloadConfig::strategy() const {
  if (layerwise && model_level) {
    log_info(
        "both model-level and layerwise offload are enabled: layerwise wins (it already "
        "keeps only a window of blocks on the device)");
    return Strategy::kLayerwise;
  }
  if (layerwise) return Strategy::kLayerwise;
  if (model_level) return Strategy::kModelLevel;
  return Strategy::kNone;
}

void OffloadConfig::validate() const {
  OMNI_CHECK(num_gpu_layers >= 1, "num_gpu_layers must be >= 1, got ", num_gpu_layers);
  OMNI_CHECK(std::isfinite(offload_ratio) && offload_ratio >= 0.0 && offload_ratio <= 1.0,
             "offload_ratio must be in [0, 1], got ", offload_ratio);
}

}  // namespace omni::offload
