// Checks shared by the config.json parsers of every family: each failure names the file and the
// dotted field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cpu_offload/check.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {

// Fails with the file and the dotted field when `ok` is false.
inline void require(bool ok, const HfConfig& cfg, const std::string& field,
                    const std::string& why) {
  if (!ok) {
    const std::string path = cfg.prefix().empty() ? field : cfg.prefix() + "." + field;
    OMNI_THROW(cfg.source(), ": ", path, ": ", why);
  }
}

// An integer field that must be > 0; without a default it must be present.
inline int64_t positive(const HfConfig& cfg, const std::string& field,
                        std::optional<int64_t> default_value = std::nullopt) {
  const int64_t v = cfg.get_int(field, default_value);
  require(v > 0, cfg, field, "must be > 0, got " + std::to_string(v));
  return v;
}

}  // namespace omni::models
