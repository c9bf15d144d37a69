// Pipeline YAML -> PipelineConfig: both layouts (nested `stage_args`, flat `stages`), every
// key through the schema (stage_fields.cc), positions "FILE:LINE:COL" in every message.
#include "worker/config/stage_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace omni::config {
namespace {

namespace fs = std::filesystem;
using detail::fail;
using detail::RawValue;
using detail::Section;
using detail::SetContext;
using detail::StageMarks;
using Kind = RawValue::Kind;

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

const std::vector<std::string>& keys(Section section) { return detail::section_keys(section); }
const std::vector<std::string>& ignored_keys(Section section) {
  return detail::section_ignored_keys(section);
}

// clang-format off
const std::vector<std::string> kTopLevelKeys = {"stage_args", "stages", "dtype"};
const std::vector<std::string> kIgnoredTopLevelKeys = {
    "async_chunk", "runtime", "connectors", "edges", "platforms", "pipeline", "session_mode",
    "model_runner", "active_stream_window", "duplex_session", "trust_remote_code",
    "distributed_executor_backend", "quantization", "enable_prefix_caching",
    "enable_chunked_prefill", "data_parallel_size", "pipeline_parallel_size", "custom_voice_dir"};
// clang-format on
// --- YAML --------------------------------------------------------------------------------------

std::string node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    default:
      return "nothing";
  }
}

std::string flow_text(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

class YamlParser {
 public:
  YamlParser(std::string name, SetContext context)
      : name_(std::move(name)), context_(std::move(context)) {}

  PipelineConfig parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      fail(e.mark.is_null() ? name_ : at(e.mark), e.msg);
    }
    PipelineConfig config;
    config.path = name_;
    if (!root.IsDefined() || root.IsNull()) {
      fail(name_ + ":1:1", "empty: expected a mapping with a 'stage_args' or 'stages' list");
    }
    if (!root.IsMap()) {
      fail(at(root),
           "expected a mapping with a 'stage_args' or 'stages' list, got " + node_kind(root));
    }
    std::optional<Entry> list;
    std::optional<RawValue> dtype;
    for (const Entry& e : entries(root)) {
      if (e.key == "stage_args" || e.key == "stages") {
        if (list) {
          const std::string first = list->key_where;
          fail(e.key_where,
               "both 'stage_args' (the nested layout) and 'stages' (the flat one) "
               "are given (the first at " +
                   first + "); use one");
        }
        list = e;
      } else if (e.key == "dtype") {
        dtype = raw(e);
      } else if (contains(kIgnoredTopLevelKeys, e.key)) {
        config.ignored[e.key] = raw(e).text;
      } else {
        fail(e.key_where, detail::unknown_key_message(e.key, "the top level", kTopLevelKeys,
                                                      kIgnoredTopLevelKeys));
      }
    }
    if (!list) fail(at(root), "no 'stage_args' or 'stages' list: the file names no stages");
    const bool flat = list->key == "stages";
    if (!list->value.IsSequence()) {
      fail(list->value_where,
           list->key + ": expected a list of stages, got " + node_kind(list->value));
    }
    std::vector<StageMarks> marks;
    for (const YAML::Node& item : list->value) {
      marks.emplace_back();
      config.stages.push_back(parse_stage(item, flat, marks.back()));
    }
    if (dtype) {  // the default of every stage that sets none
      const std::string value = detail::to_dtype("dtype", *dtype);
      for (auto& stage : config.stages) {
        if (stage.engine.dtype.empty()) stage.engine.dtype = value;
      }
    }
    detail::validate_stages(config, marks, list->key_where);
    return config;
  }

 private:
  struct Entry {
    std::string key;
    YAML::Node value;
    std::string key_where;
    std::string value_where;  // the key's position when the value is empty
  };

  std::string at(const YAML::Mark& mark) const {
    return name_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
  std::string at(const YAML::Node& node) const { return at(node.Mark()); }

  // A mapping's entries in order; keys must be scalars and appear once.
  std::vector<Entry> entries(const YAML::Node& map) const {
    std::vector<Entry> out;
    std::map<std::string, std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) fail(at(key), "a key must be a plain name, got " + node_kind(key));
      Entry e{key.Scalar(), value, at(key), value.IsNull() ? at(key) : at(value)};
      const auto [first, inserted] = seen.emplace(e.key, e.key_where);
      if (!inserted) {
        fail(e.key_where, "'" + e.key + "' is given twice (first at " + first->second + ")");
      }
      out.push_back(std::move(e));
    }
    return out;
  }

  RawValue raw(const YAML::Node& node, const std::string& where) const {
    RawValue v;
    v.where = where;
    switch (node.Type()) {
      case YAML::NodeType::Scalar:
        v.kind = Kind::kScalar;
        v.text = node.Scalar();
        v.quoted = node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
        break;
      case YAML::NodeType::Sequence:
        v.kind = Kind::kSequence;
        v.text = flow_text(node);
        for (const YAML::Node& item : node) {
          v.items.push_back(raw(item, item.IsNull() ? where : at(item)));
        }
        break;
      case YAML::NodeType::Map:
        v.kind = Kind::kMapping;
        v.text = flow_text(node);
        break;
      default:
        v.kind = Kind::kNull;
        v.text = "null";
    }
    return v;
  }
  RawValue raw(const Entry& e) const { return raw(e.value, e.value_where); }

  void expect_mapping(const Entry& e) const {
    if (!e.value.IsMap() && !e.value.IsNull()) {
      fail(e.value_where, e.key + ": expected a mapping, got " + node_kind(e.value));
    }
  }

  // Sets one key of a nested section; `seen` catches a key given both flat and nested.
  void set(StageConfig& stage, Section section, const Entry& e, const std::string& what,
           std::map<std::string, std::string>& seen) {
    if (!detail::set_field(stage, section, e.key, raw(e), context_)) {
      fail(e.key_where, detail::unknown_key_message(e.key, what, detail::section_keys(section),
                                                    ignored_keys(section)));
    }
    const auto [first, inserted] = seen.emplace(e.key, e.key_where);
    if (!inserted) {
      fail(e.key_where, "'" + e.key + "' is given twice (first at " + first->second + ")");
    }
  }

  StageConfig parse_stage(const YAML::Node& item, bool flat, StageMarks& marks) {
    StageConfig stage;
    stage.location = {name_, item.Mark().line + 1, item.Mark().column + 1};
    marks.stage = marks.stage_id = marks.required = marks.final_output = at(item);
    if (!item.IsMap()) {
      fail(at(item), "a stage must be a mapping (stage_id, " +
                         std::string(flat ? "model_stage" : "engine_args") + ", ...), got " +
                         node_kind(item));
    }
    bool has_id = false;
    std::map<std::string, std::string> engine_seen, runtime_seen;
    for (const Entry& e : entries(item)) {
      const std::string& key = e.key;
      if (key == "stage_id") {
        stage.stage_id = detail::to_int(key, raw(e));
        marks.stage_id = e.value_where;
        has_id = true;
        if (stage.stage_id < 0) {
          fail(e.value_where, "stage_id must be >= 0, got " + std::to_string(stage.stage_id));
        }
      } else if (key == "runtime") {
        expect_mapping(e);
        for (const Entry& r : entries(e.value)) {
          set(stage, Section::kRuntime, r, "runtime", runtime_seen);
        }
      } else if (key == "engine_args") {
        expect_mapping(e);
        if (!flat) marks.required = e.key_where;
        for (const Entry& a : entries(e.value)) {
          set(stage, Section::kEngine, a, "engine_args", engine_seen);
        }
      } else if (key == "default_sampling_params") {
        expect_mapping(e);
        std::map<std::string, std::string> seen;
        for (const Entry& p : entries(e.value)) {
          set(stage, Section::kSampling, p, "default_sampling_params", seen);
        }
      } else if (key == "engine_input_source") {
        const RawValue v = raw(e);
        stage.engine_input_source =
            v.kind == Kind::kNull ? std::vector<int64_t>{} : detail::to_int_list(key, v);
        marks.sources.clear();
        for (const auto& source : v.items) marks.sources.push_back(source.where);
      } else if (detail::set_field(stage, Section::kStage, key, raw(e), context_)) {
        if (key == "final_output") marks.final_output = e.value_where;
      } else if (flat && (contains(keys(Section::kEngine), key) ||
                          contains(ignored_keys(Section::kEngine), key))) {
        set(stage, Section::kEngine, e, "a stage", engine_seen);
      } else if (flat && contains(keys(Section::kRuntime), key)) {
        set(stage, Section::kRuntime, e, "a stage", runtime_seen);
      } else if (!flat && (contains(keys(Section::kEngine), key) ||
                           contains(ignored_keys(Section::kEngine), key))) {
        const std::string message = "'" + key +
                                    "' belongs under engine_args in the 'stage_args' "
                                    "layout (the flat 'stages' layout puts it in the stage)";
        fail(e.key_where, message);
      } else if (!flat && contains(keys(Section::kRuntime), key)) {
        fail(e.key_where, "'" + key + "' belongs under runtime");
      } else {
        std::vector<std::string> known = keys(Section::kStage);
        std::vector<std::string> ignored = ignored_keys(Section::kStage);
        if (flat) {
          known.insert(known.end(), keys(Section::kEngine).begin(), keys(Section::kEngine).end());
          known.insert(known.end(), keys(Section::kRuntime).begin(), keys(Section::kRuntime).end());
          ignored.insert(ignored.end(), ignored_keys(Section::kEngine).begin(),
                         ignored_keys(Section::kEngine).end());
        }
        fail(e.key_where, detail::unknown_key_message(key, "a stage", known, ignored));
      }
    }
    if (!has_id) fail(at(item), "the stage has no stage_id");
    return stage;
  }

  std::string name_;
  SetContext context_;
};

}  // namespace

PipelineConfig parse_pipeline_config(const std::string& yaml_text, const std::string& name,
                                     const std::string& base_dir, bool check_model_dirs) {
  SetContext context;
  context.base_dir = fs::absolute(base_dir.empty() ? "." : base_dir).lexically_normal().string();
  context.check_model_dirs = check_model_dirs;
  return YamlParser(name, context).parse(yaml_text);
}

PipelineConfig load_pipeline_config(const std::string& path, bool check_model_dirs) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ConfigError(path + ": is a directory, not a YAML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the file: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  const fs::path dir = fs::absolute(path).parent_path();
  return parse_pipeline_config(text.str(), path, dir.string(), check_model_dirs);
}

}  // namespace omni::config
