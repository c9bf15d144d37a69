#include "worker/config/stage_overrides.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "worker/config/stage_values.h"

namespace omni::config {
namespace {

using detail::RawValue;
using detail::Section;
using detail::SetContext;
using detail::trim;
using Kind = RawValue::Kind;
using json = nlohmann::json;

const char kOverrides[] = "--stage-overrides";

std::string ids_text(const PipelineConfig& config) {
  std::string out;
  for (const auto& s : config.stages) out += (out.empty() ? "" : ", ") + std::to_string(s.stage_id);
  return out;
}

std::string json_kind(const json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  if (j.is_string()) return "the string " + j.dump();
  if (j.is_null()) return "null";
  return j.dump();
}

RawValue from_json(const json& j, const std::string& where) {
  RawValue v;
  v.where = where;
  v.text = j.is_string() ? j.get<std::string>() : j.dump();
  if (j.is_null()) {
    v.kind = Kind::kNull;
  } else if (j.is_array()) {
    v.kind = Kind::kSequence;
    for (const auto& item : j) v.items.push_back(from_json(item, where));
  } else if (j.is_object()) {
    v.kind = Kind::kMapping;
  } else {
    v.kind = Kind::kScalar;
    v.quoted = j.is_string();
  }
  return v;
}

RawValue scalar(std::string text, const std::string& flag, bool quoted) {
  RawValue v;
  v.kind = Kind::kScalar;
  v.text = std::move(text);
  v.quoted = quoted;
  v.where = flag;
  return v;
}

// Sets one engine_args key on every stage from a flag.
void set_all(PipelineConfig& config, const std::string& key, const RawValue& value) {
  SetContext context;
  for (auto& stage : config.stages) detail::set_field(stage, Section::kEngine, key, value, context);
}

void apply_flags(PipelineConfig& config, const GlobalStageFlags& flags) {
  if (flags.cpu_offload_components) {
    std::vector<std::string> stage_names, modules;
    std::vector<std::string> names;  // an entry may hold several, comma-separated
    for (const std::string& entry : *flags.cpu_offload_components) {
      std::stringstream in(entry + ",");
      for (std::string name; std::getline(in, name, ',');) names.push_back(trim(name));
    }
    for (const std::string& name : names) {
      if (name.empty()) throw ConfigError("--cpu-offload-components: an empty name");
      // A name some stage has as its model_stage selects those stages; any other is a module.
      const bool stage =
          std::any_of(config.stages.begin(), config.stages.end(),
                      [&](const StageConfig& s) { return s.engine.model_stage == name; });
      auto& to = stage ? stage_names : modules;
      if (std::find(to.begin(), to.end(), name) == to.end()) to.push_back(name);
    }
    for (auto& stage : config.stages) {
      if (std::find(stage_names.begin(), stage_names.end(), stage.engine.model_stage) !=
          stage_names.end()) {
        stage.engine.offload_stage = true;
      }
      if (!modules.empty()) {
        stage.engine.cpu_offload_components = modules;
        stage.engine.cpu_offload_enabled = true;
      }
    }
  }
  auto flag_bool = [&](const std::optional<bool>& value, const char* flag, const char* key) {
    if (value) set_all(config, key, scalar(*value ? "true" : "false", flag, false));
  };
  flag_bool(flags.cpu_offload_enabled, "--cpu-offload-enabled", "cpu_offload_enabled");
  if (flags.cpu_offload_strategy) {
    set_all(config, "cpu_offload_strategy",
            scalar(*flags.cpu_offload_strategy, "--cpu-offload-strategy", true));
  }
  flag_bool(flags.cpu_offload_pin_memory, "--cpu-offload-pin-memory", "cpu_offload_pin_memory");
  flag_bool(flags.enable_cpu_offload, "--enable-cpu-offload", "enable_cpu_offload");
  flag_bool(flags.enable_layerwise_offload, "--enable-layerwise-offload",
            "enable_layerwise_offload");
  if (flags.layerwise_num_gpu_layers) {
    set_all(config, "layerwise_num_gpu_layers",
            scalar(std::to_string(*flags.layerwise_num_gpu_layers), "--layerwise-num-gpu-layers",
                   false));
  }
  if (flags.gpu_memory_budget) {
    set_all(config, "gpu_memory_budget",
            scalar(std::to_string(*flags.gpu_memory_budget), "--gpu-memory-budget", false));
  }
  if (flags.dtype) set_all(config, "dtype", scalar(*flags.dtype, "--dtype", true));
  flag_bool(flags.cpu_offload_experts, "--cpu-offload-experts", "cpu_offload_experts");
  if (flags.expert_cache_budget) {
    set_all(config, "expert_cache_budget",
            scalar(*flags.expert_cache_budget, "--expert-cache-budget", true));
  }
  flag_bool(flags.expert_prefetch, "--no-expert-prefetch", "expert_prefetch");
  if (flags.expert_miss_policy) {
    set_all(config, "expert_miss_policy",
            scalar(*flags.expert_miss_policy, "--expert-miss-policy", true));
  }
  if (flags.expert_eviction) {
    set_all(config, "expert_eviction", scalar(*flags.expert_eviction, "--expert-eviction", true));
  }
  if (flags.host_memory_budget) {
    set_all(config, "host_memory_budget",
            scalar(std::to_string(*flags.host_memory_budget), "--host-memory-budget", false));
  }
  if (flags.disk_read) set_all(config, "disk_read", scalar(*flags.disk_read, "--disk-read", true));
}

[[noreturn]] void overrides_error(const std::string& message) {
  throw ConfigError(std::string(kOverrides) + ": " + message);
}

// The keys of one section object ("default_sampling_params": {...}).
void apply_section(StageConfig& stage, Section section, const char* name, const json& object,
                   const std::string& where, const SetContext& context) {
  const std::string here = where + ": " + name;
  if (!object.is_object()) {
    throw ConfigError(here + ": expected an object, got " + json_kind(object));
  }
  for (const auto& [key, value] : object.items()) {
    if (!detail::set_field(stage, section, key, from_json(value, here), context)) {
      throw ConfigError(here + ": " +
                        detail::unknown_key_message(key, name, detail::section_keys(section),
                                                    detail::section_ignored_keys(section)));
    }
  }
}

void apply_overrides(PipelineConfig& config, const std::string& text) {
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return std::isspace(static_cast<unsigned char>(c)); })) {
    return;
  }
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line ..."
    const auto bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) {
      what = what.substr(bracket + 2);
    }
    overrides_error("not valid JSON: " + what);
  }
  if (!root.is_object()) {
    overrides_error(
        "expected a JSON object keyed by stage id, e.g. {\"0\": {\"dtype\": "
        "\"float32\"}}, got " +
        json_kind(root));
  }
  SetContext context;
  context.base_dir = std::filesystem::current_path().string();
  context.check_model_dirs = true;
  for (const auto& [id_text, object] : root.items()) {
    const bool digits = !id_text.empty() && id_text.size() <= 18 &&
                        std::all_of(id_text.begin(), id_text.end(), [](char c) {
                          return std::isdigit(static_cast<unsigned char>(c));
                        });
    if (!digits) {
      overrides_error("'" + id_text + "' is not a stage id (stages: " + ids_text(config) + ")");
    }
    const int64_t id = std::stoll(id_text);
    auto stage = std::find_if(config.stages.begin(), config.stages.end(),
                              [&](const StageConfig& s) { return s.stage_id == id; });
    if (stage == config.stages.end()) {
      overrides_error("no stage " + id_text + " (stages: " + ids_text(config) + ")");
    }
    const std::string where = std::string(kOverrides) + ": stage " + id_text;
    if (!object.is_object()) {
      throw ConfigError(where + ": expected an object of engine_args keys, got " +
                        json_kind(object));
    }
    for (const auto& [key, value] : object.items()) {
      if (key == "default_sampling_params") {
        apply_section(*stage, Section::kSampling, "default_sampling_params", value, where, context);
      } else if (key == "runtime") {
        apply_section(*stage, Section::kRuntime, "runtime", value, where, context);
      } else if (key == "engine_args") {
        apply_section(*stage, Section::kEngine, "engine_args", value, where, context);
      } else if (!detail::set_field(*stage, Section::kEngine, key, from_json(value, where),
                                    context)) {
        std::vector<std::string> known = detail::section_keys(Section::kEngine);
        known.insert(known.end(), {"default_sampling_params", "runtime", "engine_args"});
        throw ConfigError(
            where + ": " +
            detail::unknown_key_message(key, "the stage's overrides", known,
                                        detail::section_ignored_keys(Section::kEngine)));
      }
    }
  }
}

}  // namespace

void apply_stage_flags(PipelineConfig& config, const GlobalStageFlags& flags,
                       const std::string& stage_overrides_json) {
  apply_flags(config, flags);
  apply_overrides(config, stage_overrides_json);
  try {
    detail::validate_pipeline(config);
  } catch (const ConfigError& e) {
    overrides_error(std::string("the result is invalid: ") + e.what());
  }
}

uint64_t parse_byte_size(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) throw std::invalid_argument("an empty byte size");
  const std::string s = text.substr(first, text.find_last_not_of(" \t") - first + 1);
  const std::string usage =
      " (an integer number of bytes, or a number with a unit: B, KB, MB, GB, TB (powers of "
      "1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 20GiB)";
  if (s[0] == '-') throw std::invalid_argument("a byte size cannot be negative: '" + s + "'");
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string whole = s.substr(0, i);
  std::string fraction;
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    fraction = s.substr(start, i - start);
  }
  if (whole.empty() && fraction.empty()) {
    throw std::invalid_argument("'" + s + "' is not a byte size" + usage);
  }
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  std::string unit = s.substr(i);
  unit = detail::lower(unit);
  static const std::vector<std::pair<std::string, uint64_t>> kUnits = {
      {"", 1},
      {"b", 1},
      {"kb", 1000ULL},
      {"mb", 1000ULL * 1000},
      {"gb", 1000ULL * 1000 * 1000},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
      {"kib", 1ULL << 10},
      {"mib", 1ULL << 20},
      {"gib", 1ULL << 30},
      {"tib", 1ULL << 40}};
  const auto found =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const auto& u) { return u.first == unit; });
  if (found == kUnits.end()) {
    throw std::invalid_argument("unknown unit '" + s.substr(i) + "' in '" + s + "'" + usage);
  }
  const uint64_t scale = found->second;
  const std::string too_large = "'" + s + "' is too large (at most 2^64 - 1 bytes)";
  uint64_t value = 0;
  for (char c : whole) {
    if (__builtin_mul_overflow(value, 10, &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(c - '0'), &value)) {
      throw std::invalid_argument(too_large);
    }
  }
  if (__builtin_mul_overflow(value, scale, &value)) throw std::invalid_argument(too_large);
  if (!fraction.empty()) {  // the fraction's bytes, rounded to the nearest byte
    long double part = std::stold("0." + fraction) * static_cast<long double>(scale);
    const long double rounded = std::round(part);
    if (scale == 1 && rounded != part) {
      throw std::invalid_argument("'" + s + "' is not a whole number of bytes");
    }
    if (__builtin_add_overflow(value, static_cast<uint64_t>(rounded), &value)) {
      throw std::invalid_argument(too_large);
    }
  }
  return value;
}

}  // namespace omni::config
