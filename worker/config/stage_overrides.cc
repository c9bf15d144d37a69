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

// --cpu-offload-components: stage names select stages, other names are modules of every stage.
void apply_components_flag(PipelineConfig& config, const EngineFlag& flag) {
  std::vector<std::string> stage_names, modules;
  for (const std::string& entry : flag.values) {
    std::stringstream in(entry + ",");
    for (std::string name; std::getline(in, name, ',');) {
      name = trim(name);
      if (name.empty()) throw ConfigError(flag.flag + ": an empty name");
      // A name some stage has as its model_stage selects those stages; any other is a module.
      const bool stage =
          std::any_of(config.stages.begin(), config.stages.end(),
                      [&](const StageConfig& s) { return s.engine.model_stage == name; });
      auto& to = stage ? stage_names : modules;
      if (std::find(to.begin(), to.end(), name) == to.end()) to.push_back(name);
    }
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

void apply_flags(PipelineConfig& config, const EngineFlags& flags) {
  const SetContext context;
  for (const EngineFlag& flag : flags) {
    if (flag.key == "cpu_offload_components") {
      apply_components_flag(config, flag);
      continue;
    }
    const EngineOption* option = find_engine_option(flag.key);
    if (option == nullptr || flag.values.empty()) {
      throw ConfigError(flag.flag + ": no engine option '" + flag.key + "'");
    }
    RawValue value;
    value.kind = Kind::kScalar;
    value.text = flag.values.back();
    value.where = flag.flag;
    for (auto& stage : config.stages) option->set(stage.engine, value, context);
  }
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

void apply_stage_flags(PipelineConfig& config, const EngineFlags& flags,
                       const std::string& stage_overrides_json) {
  apply_flags(config, flags);
  apply_overrides(config, stage_overrides_json);
  try {
    detail::validate_pipeline(config);
  } catch (const ConfigError& e) {
    overrides_error(std::string("the result is invalid: ") + e.what());
  }
}

}  // namespace omni::config
