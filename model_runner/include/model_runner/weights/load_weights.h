// Binds a module's parameters to checkpoint tensors by name: parameter "layers.0.fc1.weight"
// of a module loaded with prefix "thinker.audio_tower." takes checkpoint tensor
// "thinker.audio_tower.layers.0.fc1.weight".
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_offload/offload_config.h"

namespace omni::models {

class SafetensorsCheckpoint;

struct LoadWeightsReport {
  int64_t tensors = 0;
  int64_t bytes = 0;      // parameter bytes bound
  int64_t converted = 0;  // tensors copied because the checkpoint dtype differed
  // With defer_conversion: the parameters left in the checkpoint's dtype, by name in the
  // module, and the dtype the module wants for each (for OffloadConfig::convert_dtypes).
  std::unordered_map<std::string, at::ScalarType> deferred;
  // Where each parameter bound without a copy (a view of the file, converted or not) lies in
  // its file, by name in the module: for the disk tier (OffloadConfig::disk_files).
  offload::TensorFiles files;
};

// Every parameter of `module` must exist under `prefix` with exactly the parameter's shape;
// every checkpoint tensor under `prefix` must be a parameter (a stale or mismatched checkpoint
// fails loudly instead of running with random weights). Errors name the checkpoint file, the
// tensor, the expected and actual shapes, and similar names for a missing tensor.
//
// A tensor of the parameter's dtype is bound without a copy: the parameter then views the
// file's read-only mapping (the weights exist once in RAM, in the page cache), and the offload
// engine copies from it into its slabs. Other dtypes are converted (one copy of each), unless
// `defer_conversion`: then they too view the file, in its dtype, and are listed in
// `deferred` for the offload engine to convert unit by unit while packing (the converted model
// never exists twice in host memory). Such a module must go through apply_offload before use.
LoadWeightsReport load_weights(torch::nn::Module& module, const SafetensorsCheckpoint& checkpoint,
                               const std::string& prefix, bool defer_conversion = false);

// Adds `report.deferred` to `convert_dtypes` (OffloadConfig's) under `root_prefix`, the path of
// the loaded module from the root that apply_offload is given ("" or e.g. "thinker.").
void defer_conversions(const LoadWeightsReport& report, const std::string& root_prefix,
                       std::unordered_map<std::string, at::ScalarType>& convert_dtypes);
// Adds `report.files` to `disk_files` (OffloadConfig's) under `root_prefix`.
void add_disk_files(const LoadWeightsReport& report, const std::string& root_prefix,
                    offload::TensorFiles& disk_files);

// The compute dtype to build a model in: `requested`, or where that is Undefined ("auto"), the
// floating dtype holding most of the checkpoint's bytes under `prefix` (bf16 stays bf16: no
// conversion, no second copy), float32 when it has no floating tensor there.
at::ScalarType resolve_dtype(at::ScalarType requested, const SafetensorsCheckpoint& checkpoint,
                             const std::string& prefix);

}  // namespace omni::models
