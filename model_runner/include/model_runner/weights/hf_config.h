// A Hugging Face config.json with typed getters. Fields are addressed by dotted paths
// ("thinker_config.text_config.hidden_size"), and every error names the file, the full dotted
// field and the expected vs actual JSON type, because a wrong config is the most common way a
// model fails to load and the JSON is usually hundreds of lines.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace omni::models {

class HfConfig {
 public:
  // `path` is a config.json file or a directory that holds one.
  static HfConfig load(const std::string& path);
  // Parses `text`; `source` names it in errors (a file path, or e.g. "inline config").
  static HfConfig parse(const std::string& text, const std::string& source);

  // A JSON null counts as absent (Hugging Face writes null for "not set", e.g.
  // "rope_scaling": null): has() is false and getters return their default. Without a default,
  // an absent field throws "... is missing" and a null one a type error.
  bool has(const std::string& dotted) const;
  int64_t get_int(const std::string& dotted,
                  std::optional<int64_t> default_value = std::nullopt) const;
  // Accepts integers too ("rope_theta": 1000000).
  double get_double(const std::string& dotted,
                    std::optional<double> default_value = std::nullopt) const;
  bool get_bool(const std::string& dotted, std::optional<bool> default_value = std::nullopt) const;
  std::string get_string(const std::string& dotted,
                         std::optional<std::string> default_value = std::nullopt) const;
  std::vector<int64_t> get_int_list(
      const std::string& dotted,
      std::optional<std::vector<int64_t>> default_value = std::nullopt) const;
  // The nested object at `dotted` (e.g. "thinker_config.text_config"); its errors still name
  // the file and the full path from the root.
  HfConfig sub(const std::string& dotted) const;
  // "architectures" (e.g. {"Qwen3OmniMoeForConditionalGeneration"}); empty when absent.
  std::vector<std::string> architectures() const;

  const std::string& source() const { return source_; }
  // Dotted path of this object from the root of the file; "" for the root.
  const std::string& prefix() const { return prefix_; }
  // The underlying JSON of this (sub-)config, for what the getters do not cover (e.g. a key
  // that itself contains a '.', which a dotted path cannot address).
  const nlohmann::json& raw() const { return *node_; }

 private:
  HfConfig(std::string source, std::string prefix, std::shared_ptr<const nlohmann::json> node);

  // The value at `dotted` (possibly null), or nullptr when it or a level on the way is absent
  // or null. Throws when a level on the way is neither an object nor null.
  const nlohmann::json* find(const std::string& dotted) const;
  // The non-null value at `dotted` for a getter expecting `expected` ("an integer"); nullptr
  // when it is absent or null and the getter has a default; throws when it has none.
  const nlohmann::json* lookup(const std::string& dotted, bool has_default,
                               const char* expected) const;
  std::string full_path(const std::string& dotted) const;
  [[noreturn]] void throw_missing(const std::string& dotted) const;
  [[noreturn]] void throw_type(const std::string& field, const char* expected,
                               const nlohmann::json& actual) const;

  std::string source_;
  std::string prefix_;
  // Aliases the parsed root, which every sub() shares.
  std::shared_ptr<const nlohmann::json> node_;
};

}  // namespace omni::models
