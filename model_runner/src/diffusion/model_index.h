// Reading a diffusers pipeline folder's model_index.json (internal to model_runner/src/diffusion):
// which parts it names, and that their folders exist.
#pragma once

#include <string>

#include "model_runner/weights/hf_config.h"

namespace omni::models {

// `dir`/model_index.json; throws naming the path when `dir` is not a pipeline folder.
HfConfig load_model_index(const std::string& dir);

// model_index.json names a part as ["library", "Class"]; [null, null] (or an absent key) is
// "not there". Throws naming the field when the entry has another shape.
bool component_present(const HfConfig& index, const std::string& name);

// Throws naming the part when model_index.json names it but `dir`/`name` is not a folder.
void require_folder(const std::string& dir, const std::string& name);

}  // namespace omni::models
