// Reads a stage YAML (the vLLM-Omni layouts) into a PipelineConfig. Every problem is a
// ConfigError whose message starts with "FILE:LINE:COL: " (1-based), so that a user can jump to it.
#pragma once

#include <string>

#include "worker/config/stage_config.h"

namespace omni::config {

// Reads, parses and validates. `check_model_dirs` = false skips the check that every model
// directory exists (the paths are still made absolute): for configs of checkpoints not present.
PipelineConfig load_pipeline_config(const std::string& path, bool check_model_dirs = true);
// `base_dir` resolves relative model paths; `name` is what errors call the file.
PipelineConfig parse_pipeline_config(const std::string& yaml_text, const std::string& name,
                                     const std::string& base_dir, bool check_model_dirs = true);

}  // namespace omni::config
