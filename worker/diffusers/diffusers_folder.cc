#include "worker/diffusers/diffusers_folder.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"

namespace omni::pipeline {

bool is_diffusers_folder(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / "model_index.json", ec);
}

std::string diffusers_pipeline_class(const std::string& dir) {
  if (!is_diffusers_folder(dir)) return "";
  std::ifstream in(std::filesystem::path(dir) / "model_index.json");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("_class_name") || !j.at("_class_name").is_string()) return "";
  return j.at("_class_name").get<std::string>();
}

int64_t diffusers_frame_rate(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "model_index.json").string();
  std::ifstream in(path);
  OMNI_CHECK(in.good(), "cannot read '", path, "'");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  OMNI_CHECK(j.is_object(), "'", path, "' is not a JSON object");
  if (j.contains("fps") && j.at("fps").is_number()) {
    const int64_t fps = j.at("fps").get<int64_t>();
    OMNI_CHECK(fps >= 1 && fps <= 1000, "'", path, "': fps must be 1 to 1000, got ", fps);
    return fps;
  }
  const bool expand = j.contains("expand_timesteps") && j.at("expand_timesteps").is_boolean() &&
                      j.at("expand_timesteps").get<bool>();
  return expand ? 24 : 16;
}

}  // namespace omni::pipeline
