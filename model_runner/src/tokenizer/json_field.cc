#include "json_field.h"

#include <limits>

#include "cpu_offload/check.h"

namespace omni::models {

JsonField::JsonField(const nlohmann::json& value, const std::string& source, std::string path)
    : value_(&value), source_(&source), path_(std::move(path)) {}

void JsonField::fail(const std::string& message) const {
  if (path_.empty()) OMNI_THROW(*source_, ": ", message);
  OMNI_THROW(*source_, ": field '", path_, "': ", message);
}

void JsonField::fail_missing(const std::string& key, const std::string& why) const {
  OMNI_THROW(*source_, ": field '", path_.empty() ? key : path_ + "." + key, "' is missing", why);
}

void JsonField::expect(bool ok, const char* expected) const {
  if (!ok) fail(std::string("must be ") + expected + ", got " + value_->type_name());
}

std::optional<JsonField> JsonField::find(const std::string& key) const {
  expect(value_->is_object(), "an object");
  const auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return std::nullopt;
  return JsonField(*it, *source_, path_.empty() ? key : path_ + "." + key);
}

JsonField JsonField::get(const std::string& key) const {
  std::optional<JsonField> field = find(key);
  if (!field) fail_missing(key);
  return *field;
}

std::vector<JsonField> JsonField::items() const {
  expect(value_->is_array(), "an array");
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) {
    out.emplace_back((*value_)[i], *source_, path_ + "[" + std::to_string(i) + "]");
  }
  return out;
}

std::string JsonField::string() const {
  expect(value_->is_string(), "a string");
  return value_->get<std::string>();
}

bool JsonField::boolean() const {
  expect(value_->is_boolean(), "a boolean");
  return value_->get<bool>();
}

int64_t JsonField::integer() const {
  expect(value_->is_number_integer(), "an integer");
  if (value_->is_number_unsigned() &&
      value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail("does not fit in int64");
  }
  return value_->get<int64_t>();
}

double JsonField::number() const {
  expect(value_->is_number(), "a number");
  return value_->get<double>();
}

bool JsonField::get_bool(const std::string& key, bool default_value) const {
  const auto field = find(key);
  return field ? field->boolean() : default_value;
}

std::string JsonField::get_string(const std::string& key, const std::string& default_value) const {
  const auto field = find(key);
  return field ? field->string() : default_value;
}

}  // namespace omni::models
