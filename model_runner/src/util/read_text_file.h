// Reading a whole (small) file, for the JSON files of a checkpoint. Internal to model_runner.
#pragma once

#include <string>

namespace omni::models {

// The file's bytes; throws omni::Error "cannot read <what> '<path>': <reason>".
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace omni::models
