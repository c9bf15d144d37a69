// What the engine reads of a diffusers pipeline folder before loading it: whether a --model
// directory is one (it has model_index.json, as vLLM-Omni decides), and its video frame rate.
#pragma once

#include <cstdint>
#include <string>

namespace omni::pipeline {

// `dir` holds a model_index.json (a diffusers pipeline rather than a transformers checkpoint).
bool is_diffusers_folder(const std::string& dir);

// model_index.json's `_class_name` ("WanPipeline", "QwenImagePipeline", ...): which family's
// pipeline the folder is; "" when `dir` is not a diffusers folder or names no class.
std::string diffusers_pipeline_class(const std::string& dir);

// Frames per second of the videos the folder's pipeline makes: model_index.json's `fps` when
// it has one, else 24 for per-token-timestep folders (expand_timesteps: Wan2.2 TI2V-5B) and 16
// otherwise (Wan2.1, Wan2.2 A14B), the rates their model cards use. Throws omni::Error naming
// the file when it cannot be read.
int64_t diffusers_frame_rate(const std::string& dir);

}  // namespace omni::pipeline
