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

#include "worker/config/engine_options.h"
#include "worker/config/stage_config.h"

namespace omni::config {

// Applies `flags` to every stage, then `stage_overrides_json` (may be empty): a JSON object keyed
// by stage id ("1"), each an object of engine_args keys (flat; the YAML's names and value types,
// byte sizes as an integer or a string such as "20GiB", null = the default) plus optionally
// "default_sampling_params": {...}, "runtime": {...} and "engine_args": {...} objects. A relative
// `model` is resolved against the current directory and must exist. Then re-validates.
// Errors: ConfigError; for the overrides the message starts with "--stage-overrides: " (not
// JSON, with the parser's position; not an object; an id that is no stage, listing the ids; an
// unknown key, with "did you mean"; a wrong type or value).
//
// `flags` are engine options (engine_options.h) in the order given; errors name the flag. One
// differs from its YAML key: --cpu-offload-components' names that are the model_stage of stages
// of the config (thinker, talker, code2wav) select those STAGES (offload_stage = true on them);
// its other names (visual, audio_tower, globs such as thinker.*) REPLACE cpu_offload_components of
// every stage and set cpu_offload_enabled on every stage (an explicit --cpu-offload-enabled after
// it wins).
void apply_stage_flags(PipelineConfig& config, const EngineFlags& flags,
                       const std::string& stage_overrides_json);

}  // namespace omni::config
