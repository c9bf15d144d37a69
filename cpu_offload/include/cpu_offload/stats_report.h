// One JSON object with every offload figure of a runner: what a stage reports and what
// `vllm-omni generate --json` prints under "offload".
#pragma once

#include <string>

#include "cpu_offload/expert_cache.h"
#include "cpu_offload/offload_backend.h"

namespace omni::offload {

// The backend's OffloadStats, plus under a host memory budget the layers' disk tier under
// "disk", plus with expert offload the expert cache's ExpertCacheStats under "expert_cache"
// (its disk tier, if any, under "expert_cache"."disk"). Waits for outstanding copies (stats()).
std::string offload_report_json(OffloadBackend& backend, ExpertCache* experts);

}  // namespace omni::offload
