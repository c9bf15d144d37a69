// What goes where: the plan a backend executes, computed from the model, its spec and the
// config without touching any weight (so it can be inspected and tested on its own).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "cpu_offload/model_spec.h"
#include "cpu_offload/offload_config.h"

namespace omni::offload {

struct UnitPlan {
  std::string name;                       // the module path of the unit
  std::vector<std::string> tensor_names;  // dotted tensor names, each tensor listed once
  size_t bytes = 0;                       // the tensors' own bytes
  // Layerwise: units with the same order group form one cyclic execution order (one per DiT),
  // in which the next units are prefetched.
  int order_group = 0;
};

struct GroupPlan {
  std::string name;             // "encoders", a DiT's path, or the VAE's
  std::vector<UnitPlan> units;  // one per component: a component moves in one copy
  size_t bytes = 0;
};

struct OffloadPlan {
  Strategy strategy = Strategy::kNone;
  std::vector<std::string> resident_tensors;  // stay on the device for good
  size_t resident_bytes = 0;
  // layerwise: the streamed units in execution order; component: the offloaded components
  std::vector<UnitPlan> units;
  std::vector<GroupPlan> groups;  // model-level: the mutually exclusive groups
  size_t param_bytes = 0;         // every distinct parameter and buffer of the model
  // Expert offload (OffloadConfig::expert_modules): one unit per matched module, carved out
  // of the resident set and of the strategy's units; they go to an ExpertCache.
  std::vector<UnitPlan> experts;
  size_t expert_bytes = 0;

  std::string describe() const;
};

// Throws omni::Error for invalid settings (bad config values, unknown block list or
// component, a block list with no blocks). Documented fallbacks: model-level offload of a
// model with no encoders and a single DiT has nothing to alternate with, so it logs a warning
// and keeps everything resident.
OffloadPlan make_offload_plan(torch::nn::Module& root, const ModelSpec& spec,
                              const OffloadConfig& config);

}  // namespace omni::offload
