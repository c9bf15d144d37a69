// Binds a module's parameters to checkpoint tensors by name: parameter "layers.0.fc1.weight"
// of a module loaded with prefix "thinker.audio_tower." takes checkpoint tensor
// "thinker.audio_tower.layers.0.fc1.weight".
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {

class SafetensorsCheckpoint;

struct LoadWeightsReport {
  int64_t tensors = 0;
  int64_t bytes = 0;      // parameter bytes bound
  int64_t converted = 0;  // tensors copied because the checkpoint dtype differed
};

// Every parameter of `module` must exist under `prefix` with exactly the parameter's shape;
// every checkpoint tensor under `prefix` must be a parameter (a stale or mismatched checkpoint
// fails loudly instead of running with random weights). Errors name the checkpoint file, the
// tensor, the expected and actual shapes, and similar names for a missing tensor.
//
// A tensor of the parameter's dtype is bound without a copy: the parameter then views the
// file's read-only mapping (the weights exist once in RAM, in the page cache), and the offload
// engine copies from it into its slabs. Other dtypes are converted (one copy).
LoadWeightsReport load_weights(torch::nn::Module& module, const SafetensorsCheckpoint& checkpoint,
                               const std::string& prefix);

}  // namespace omni::models
