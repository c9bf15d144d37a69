// Command-line changes to a parsed pipeline: the global offload flags and --stage-overrides.
//
// Precedence, highest first: --stage-overrides > the global flags > the YAML > the struct
// defaults. Both are applied to the structs (never to YAML text) and the result is validated with
// the same checks as the YAML.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"

namespace omni::config {

// The global command-line offload flags; unset = not given. Errors name the flag ("--dtype: ...").
struct GlobalStageFlags {
  std::optional<bool> cpu_offload_enabled;  // --cpu-offload-enabled
  // --cpu-offload-components (an entry may hold several comma-separated names). A name that is
  // the model_stage of stages of the config (thinker, talker, code2wav) selects those STAGES:
  // offload_stage = true on them (their cpu_offload_enabled stays as is). Every other name
  // (visual, audio_tower, language_model, code_predictor, globs like 'thinker.*') is a module
  // name: the module names REPLACE cpu_offload_components of every stage and set
  // cpu_offload_enabled = true on every stage (a stage runner ignores names that match nothing
  // in its part). An explicit cpu_offload_enabled flag is applied after this and wins.
  std::optional<std::vector<std::string>> cpu_offload_components;
  std::optional<std::string> cpu_offload_strategy;  // --cpu-offload-strategy
  std::optional<bool> cpu_offload_pin_memory;       // --cpu-offload-pin-memory
  std::optional<bool> enable_cpu_offload;           // --enable-cpu-offload
  std::optional<bool> enable_layerwise_offload;     // --enable-layerwise-offload
  std::optional<int64_t> layerwise_num_gpu_layers;  // --layerwise-num-gpu-layers
  std::optional<uint64_t> gpu_memory_budget;        // --gpu-memory-budget (bytes)
  std::optional<std::string> dtype;                 // --dtype
  std::optional<bool> cpu_offload_experts;          // --cpu-offload-experts
  std::optional<std::string> expert_cache_budget;   // --expert-cache-budget ("25%", "768MiB")
  std::optional<bool> expert_prefetch;              // --no-expert-prefetch (false)
  std::optional<std::string> expert_miss_policy;    // --expert-miss-policy
  std::optional<std::string> expert_eviction;       // --expert-eviction
  std::optional<uint64_t> host_memory_budget;       // --host-memory-budget (bytes)
  std::optional<std::string> disk_read;             // --disk-read
};

// Applies `flags` to every stage, then `stage_overrides_json` (may be empty): a JSON object keyed
// by stage id ("1"), each an object of engine_args keys (flat; the YAML's names and value types,
// byte sizes as an integer or a string such as "20GiB", null = the default) plus optionally
// "default_sampling_params": {...}, "runtime": {...} and "engine_args": {...} objects. A relative
// `model` is resolved against the current directory and must exist. Then re-validates.
// Errors: ConfigError; for the overrides the message starts with "--stage-overrides: " (not
// JSON, with the parser's position; not an object; an id that is no stage, listing the ids; an
// unknown key, with "did you mean"; a wrong type or value).
void apply_stage_flags(PipelineConfig& config, const GlobalStageFlags& flags,
                       const std::string& stage_overrides_json);

// "20GiB", "8GB", "1.5 GB", "123" -> bytes. Units (case-insensitive): B, KB/MB/GB/TB (powers of
// 1000), KiB/MiB/GiB/TiB (powers of 1024). Throws std::invalid_argument with the reason.
uint64_t parse_byte_size(const std::string& text);

}  // namespace omni::config
