#include "model_runner/weights/hf_config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu_offload/check.h"
#include "similar_names.h"
#include "util/read_text_file.h"

namespace omni::models {
namespace {

using Json = nlohmann::json;

// nlohmann calls every number "number"; integer vs float is what users get wrong.
std::string type_of(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "float";
  return v.type_name();
}

}  // namespace

HfConfig::HfConfig(std::string source, std::string prefix,
                   std::shared_ptr<const nlohmann::json> node)
    : source_(std::move(source)), prefix_(std::move(prefix)), node_(std::move(node)) {}

HfConfig HfConfig::load(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec)
                               ? (std::filesystem::path(path) / "config.json").string()
                               : path;
  return parse(read_text_file(file, "config"), file);
}

HfConfig HfConfig::parse(const std::string& text, const std::string& source) {
  auto root = std::make_shared<Json>();
  try {
    *root = Json::parse(text);
  } catch (const Json::parse_error& e) {
    OMNI_THROW(source, ": invalid JSON at byte ", e.byte, ": ", e.what());
  }
  if (!root->is_object()) {
    OMNI_THROW(source, ": the top level must be an object, got ", type_of(*root));
  }
  return HfConfig(source, "", std::move(root));
}

std::string HfConfig::full_path(const std::string& dotted) const {
  if (prefix_.empty()) return dotted;
  if (dotted.empty()) return prefix_;
  return prefix_ + "." + dotted;
}

const Json* HfConfig::find(const std::string& dotted) const {
  const Json* node = node_.get();
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (key.empty()) OMNI_THROW(source_, ": invalid field path '", full_path(dotted), "'");
    if (node->is_null()) return nullptr;
    if (!node->is_object()) throw_type(full_path(dotted.substr(0, start - 1)), "an object", *node);
    const auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

void HfConfig::throw_missing(const std::string& dotted) const {
  // Walk down to the deepest existing level to say what is there instead.
  const Json* node = node_.get();
  std::string parent;  // dotted path of `node` from this config
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (node->is_null()) {
      OMNI_THROW(source_, ": field '", full_path(dotted), "' is missing ('", full_path(parent),
                 "' is null)");
    }
    const auto it = node->find(key);
    if (it == node->end()) {
      std::vector<std::string> siblings;
      for (const auto& [k, v] : node->items()) {
        siblings.push_back(full_path(parent.empty() ? k : parent + "." + k));
      }
      OMNI_THROW(source_, ": field '", full_path(dotted), "' is missing",
                 detail::similar_names_suffix(full_path(dotted), siblings));
    }
    if (dot == std::string::npos) break;  // present after all: not reached from lookup()
    node = &*it;
    parent = dotted.substr(0, dot);
    start = dot + 1;
  }
  OMNI_THROW(source_, ": field '", full_path(dotted), "' is missing");
}

void HfConfig::throw_type(const std::string& field, const char* expected,
                          const nlohmann::json& actual) const {
  OMNI_THROW(source_, ": field '", field, "' must be ", expected, ", got ", type_of(actual));
}

const Json* HfConfig::lookup(const std::string& dotted, bool has_default,
                             const char* expected) const {
  const Json* v = find(dotted);
  if (v && !v->is_null()) return v;
  if (has_default) return nullptr;
  if (!v) throw_missing(dotted);
  throw_type(full_path(dotted), expected, *v);
}

bool HfConfig::has(const std::string& dotted) const {
  const Json* v = find(dotted);
  return v && !v->is_null();
}

namespace {
// Integers only: 4096.0 in a config is a bug in whatever wrote it, not a size.
int64_t to_int64(const Json& v, const std::string& source, const std::string& field) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      OMNI_THROW(source, ": field '", field, "' = ", u, " does not fit in int64");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  OMNI_THROW(source, ": field '", field, "' must be an integer, got ", type_of(v));
}
}  // namespace

int64_t HfConfig::get_int(const std::string& dotted, std::optional<int64_t> default_value) const {
  const Json* v = lookup(dotted, default_value.has_value(), "an integer");
  return v ? to_int64(*v, source_, full_path(dotted)) : *default_value;
}

double HfConfig::get_double(const std::string& dotted, std::optional<double> default_value) const {
  const Json* v = lookup(dotted, default_value.has_value(), "a number");
  if (!v) return *default_value;
  if (!v->is_number()) throw_type(full_path(dotted), "a number", *v);
  return v->get<double>();
}

bool HfConfig::get_bool(const std::string& dotted, std::optional<bool> default_value) const {
  const Json* v = lookup(dotted, default_value.has_value(), "a boolean");
  if (!v) return *default_value;
  if (!v->is_boolean()) throw_type(full_path(dotted), "a boolean", *v);
  return v->get<bool>();
}

std::string HfConfig::get_string(const std::string& dotted,
                                 std::optional<std::string> default_value) const {
  const Json* v = lookup(dotted, default_value.has_value(), "a string");
  if (!v) return *default_value;
  if (!v->is_string()) throw_type(full_path(dotted), "a string", *v);
  return v->get<std::string>();
}

std::vector<int64_t> HfConfig::get_int_list(
    const std::string& dotted, std::optional<std::vector<int64_t>> default_value) const {
  const Json* v = lookup(dotted, default_value.has_value(), "an array of integers");
  if (!v) return *default_value;
  if (!v->is_array()) throw_type(full_path(dotted), "an array of integers", *v);
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    out.push_back(to_int64((*v)[i], source_, full_path(dotted) + "[" + std::to_string(i) + "]"));
  }
  return out;
}

HfConfig HfConfig::sub(const std::string& dotted) const {
  const Json* v = lookup(dotted, /*has_default=*/false, "an object");
  if (!v->is_object()) throw_type(full_path(dotted), "an object", *v);
  // Aliasing constructor: the sub-config keeps the whole parsed file alive.
  return HfConfig(source_, full_path(dotted), std::shared_ptr<const Json>(node_, v));
}

std::vector<std::string> HfConfig::architectures() const {
  const Json* v = lookup("architectures", /*has_default=*/true, "an array of strings");
  std::vector<std::string> out;
  if (!v) return out;
  if (!v->is_array()) throw_type(full_path("architectures"), "an array of strings", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& item = (*v)[i];
    if (!item.is_string()) {
      throw_type(full_path("architectures") + "[" + std::to_string(i) + "]", "a string", item);
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace omni::models
