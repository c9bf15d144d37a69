// Writes a Qwen3-Omni-MoE checkpoint directory with random weights (config.json,
// model.safetensors, tokenizer.json, preprocessor_config.json) in the real on-disk layout, so
// benchmarks can run thinkers of chosen sizes without downloads. The tokenizer and the
// preprocessor config are copied from `assets_dir` (the tiny fixture: its vocabulary and
// special-token ids fit every preset).
#pragma once

#include <cstdint>
#include <string>

#include "model_runner/qwen3_omni/config.h"

namespace omni::models {

// "tiny" (the test fixture's shapes, ~2 MB), "small" (~0.25 GB fp32: 8 MoE layers of 16
// experts) or "medium" (~1 GB fp32: 12 layers of 32 experts, larger encoders).
qwen3_omni::ThinkerConfig synthetic_thinker_config(const std::string& preset);

// Writes the checkpoint into `dir` (created; existing files replaced). Weights ~ N(0, 0.02)
// (norm weights 1) from `seed`, stored as `dtype`. Returns the parameter bytes written.
int64_t write_synthetic_checkpoint(const std::string& dir, const qwen3_omni::ThinkerConfig& cfg,
                                   const std::string& assets_dir, at::ScalarType dtype = at::kFloat,
                                   uint64_t seed = 0);

}  // namespace omni::models
