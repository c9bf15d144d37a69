#include "model_index.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"

namespace omni::models {

namespace fs = std::filesystem;

HfConfig load_model_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "model_index.json").string();
  OMNI_CHECK(fs::exists(path), "not a diffusers pipeline folder: ", path, " is missing");
  return HfConfig::load(path);
}

bool component_present(const HfConfig& index, const std::string& name) {
  const auto& raw = index.raw();
  if (!raw.contains(name) || raw.at(name).is_null()) return false;
  const auto& entry = raw.at(name);
  OMNI_CHECK(entry.is_array() && entry.size() == 2, index.source(), ": field '", name,
             "' must be [library, class], got ", entry.dump());
  return !entry.at(1).is_null();
}

void require_folder(const std::string& dir, const std::string& name) {
  OMNI_CHECK(fs::is_directory(fs::path(dir) / name), dir, "/model_index.json names '", name,
             "' but the folder ", dir, "/", name, " is missing");
}

}  // namespace omni::models
