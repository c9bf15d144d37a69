// A value inside a tokenizer.json together with where it sits ("model.merges[3]"), so that every
// error names the file and the field: these files are megabytes of JSON, and a wrong or
// unsupported setting is the usual reason one fails to load.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace omni::models {

class JsonField {
 public:
  // `source` (the file) must outlive the field and everything made from it.
  JsonField(const nlohmann::json& value, const std::string& source, std::string path);

  const nlohmann::json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return *source_; }

  // Member `key` of this object. A JSON null counts as absent (Hugging Face writes null for
  // "not set"): get() throws "... is missing", find() returns nullopt.
  JsonField get(const std::string& key) const;
  std::optional<JsonField> find(const std::string& key) const;
  // The elements of this array.
  std::vector<JsonField> items() const;

  // This value as a type; throw naming the field, the expected and the actual type.
  std::string string() const;
  bool boolean() const;
  int64_t integer() const;
  double number() const;
  // The member's value, `default_value` when it is absent or null.
  bool get_bool(const std::string& key, bool default_value) const;
  std::string get_string(const std::string& key, const std::string& default_value) const;

  // Throws omni::Error "<source>: field '<path>': <message>".
  [[noreturn]] void fail(const std::string& message) const;
  // Throws omni::Error "<source>: field '<path>.<key>' is missing<why>".
  [[noreturn]] void fail_missing(const std::string& key, const std::string& why = "") const;

 private:
  void expect(bool ok, const char* expected) const;

  const nlohmann::json* value_;
  const std::string* source_;
  std::string path_;
};

}  // namespace omni::models
