// The stage config's schema: the keys of each section, their typed values and ranges, and the
// messages for unknown keys. Shared by the YAML reader and the command-line overrides.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "worker/config/engine_options.h"
#include "worker/config/stage_config.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_values.h"

namespace omni::config {
namespace {

namespace fs = std::filesystem;
using detail::RawValue;
using detail::Section;
using detail::SetContext;
using Kind = RawValue::Kind;

// The registered kinds' names (add_model_stage_name), constructed on first use: families add
// theirs while static objects are constructed.
std::mutex& model_stage_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& model_stages() {
  static std::vector<std::string> names;
  return names;
}

// --- key tables --------------------------------------------------------------------------------

const std::vector<std::string> kStageTypes = {"llm", "generation", "diffusion"};
const std::vector<std::string> kOutputTypes = {"text", "audio", "image"};

// clang-format off
// The keys each section gives a meaning to.
const std::vector<std::string> kStageKeys = {
    "stage_id", "stage_type", "runtime", "engine_args", "engine_input_source", "final_output",
    "final_output_type", "default_sampling_params", "custom_process_input_func",
    "is_comprehension"};
const std::vector<std::string> kRuntimeKeys = {"devices", "address", "max_batch_size", "process"};
const std::vector<std::string> kSamplingKeys = {
    "temperature", "top_p", "top_k", "max_tokens", "seed", "repetition_penalty",
    "stop_token_ids", "greedy"};

// vLLM / vLLM-Omni keys read and ignored (kept raw in StageEngineArgs::ignored and
// PipelineConfig::ignored). stage_configs/README.md lists them: keep the two in step.
const std::vector<std::string> kIgnoredStageKeys = {
    "custom_process_next_stage_input_func", "input_connectors", "output_connectors",
    "num_replicas", "env", "async_chunk", "default_pooling_params", "engine_extras",
    "subtalker_sampling_params", "silence_ban_frames", "prompt_expand_func"};
const std::vector<std::string> kIgnoredEngineKeys = {
    "worker_cls", "scheduler_cls", "worker_type", "gpu_memory_utilization", "enforce_eager",
    "trust_remote_code", "engine_output_type", "distributed_executor_backend",
    "enable_prefix_caching", "max_model_len", "hf_config_name", "tensor_parallel_size", "pipeline_parallel_size",
    "data_parallel_size", "enable_expert_parallel", "load_format", "async_scheduling",
    "quantization", "kv_cache_dtype", "swap_space", "seed", "tokenizer",
    "tokenizer_mode", "revision", "compilation_config", "limit_mm_per_prompt",
    "mm_processor_kwargs", "mm_processor_cache_gb", "disable_log_stats", "served_model_name",
    "max_cudagraph_capture_size", "skip_mm_profiling", "config_format",
    "disable_hybrid_kv_cache_manager", "profiler_config", "enable_flashinfer_autotune",
    "model_class_name", "vae_use_slicing", "vae_use_tiling", "boundary_ratio", "flow_shift",
    "cache_backend", "cache_config"};
const std::vector<std::string> kIgnoredRuntimeKeys = {"num_replicas", "env"};
const std::vector<std::string> kIgnoredSamplingKeys = {
    "detokenize", "n", "best_of", "presence_penalty", "frequency_penalty", "min_p", "min_tokens",
    "ignore_eos", "logprobs", "prompt_logprobs", "skip_special_tokens",
    "spaces_between_special_tokens", "stop", "include_stop_str_in_output", "bad_words",
    "logit_bias", "allowed_token_ids", "output_kind"};
// `dtype` at the top level is not among them: it is the default of the stages that set none.
// clang-format on

// engine_args' keys are the engine option table's.
const std::vector<std::string>& engine_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const EngineOption& o : engine_options()) out.push_back(o.key);
    return out;
  }();
  return keys;
}

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

const std::vector<std::string>& ignored_keys(Section section) {
  switch (section) {
    case Section::kStage:
      return kIgnoredStageKeys;
    case Section::kEngine:
      return kIgnoredEngineKeys;
    case Section::kRuntime:
      return kIgnoredRuntimeKeys;
    case Section::kSampling:
      return kIgnoredSamplingKeys;
  }
  return kIgnoredStageKeys;
}

// --- small helpers -----------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw ConfigError(where.empty() ? message : where + ": " + message);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// --- the sections ------------------------------------------------------------------------------

bool set_stage_key(StageConfig& s, const std::string& key, const RawValue& v) {
  const StageConfig d;
  const bool null = v.kind == Kind::kNull;
  if (key == "stage_type") {
    s.stage_type = null ? d.stage_type : one_of(key, v, kStageTypes);
  } else if (key == "final_output") {
    s.final_output = null ? d.final_output : to_bool(key, v);
  } else if (key == "final_output_type") {
    s.final_output_type = null ? d.final_output_type : one_of(key, v, kOutputTypes);
  } else if (key == "custom_process_input_func") {
    s.custom_process_input_func = null ? d.custom_process_input_func : to_string(key, v);
  } else if (key == "is_comprehension") {
    s.is_comprehension = null ? d.is_comprehension : to_bool(key, v);
  } else if (contains(kIgnoredStageKeys, key)) {
    s.engine.ignored[key] = v.text;
  } else {
    return false;
  }
  return true;
}

bool set_engine_key(StageEngineArgs& e, const std::string& key, const RawValue& v,
                    const SetContext& context) {
  if (const EngineOption* option = find_engine_option(key)) {
    option->set(e, v, context);
  } else if (contains(kIgnoredEngineKeys, key)) {
    e.ignored[key] = v.text;
  } else {
    return false;
  }
  return true;
}

bool set_runtime_key(StageConfig& s, const std::string& key, const RawValue& v) {
  const StageRuntime d;
  StageRuntime& r = s.runtime;
  const bool null = v.kind == Kind::kNull;
  if (key == "devices") {
    r.devices = null ? d.devices : to_devices(key, v);
  } else if (key == "address") {
    r.address = null ? d.address : to_address(key, v);
  } else if (key == "max_batch_size") {
    r.max_batch_size = null ? d.max_batch_size : to_int(key, v);
    if (r.max_batch_size < 1) {
      fail(v.where, key + " must be >= 1, got " + std::to_string(r.max_batch_size));
    }
  } else if (key == "process") {
    r.process = null ? d.process : to_string(key, v);
  } else if (contains(kIgnoredRuntimeKeys, key)) {
    s.engine.ignored["runtime." + key] = v.text;
  } else {
    return false;
  }
  return true;
}

bool set_sampling_key(StageConfig& s, const std::string& key, const RawValue& v) {
  SamplingDefaults& p = s.sampling;
  const bool null = v.kind == Kind::kNull;
  if (key == "temperature") {
    p.temperature = null ? std::nullopt : std::optional<double>(to_double(key, v));
    if (p.temperature && *p.temperature < 0) fail(v.where, key + " must be >= 0, got " + v.text);
  } else if (key == "top_p") {
    p.top_p = null ? std::nullopt : std::optional<double>(to_double(key, v));
    if (p.top_p && !(*p.top_p > 0 && *p.top_p <= 1)) {
      fail(v.where, key + " must be in (0, 1], got " + v.text);
    }
  } else if (key == "top_k") {
    p.top_k = null ? std::nullopt : std::optional<int64_t>(to_int(key, v));
    if (p.top_k && *p.top_k < -1) {
      fail(v.where, key + " must be >= -1 (-1 or 0 = no limit), got " + v.text);
    }
  } else if (key == "max_tokens") {
    p.max_tokens = null ? std::nullopt : std::optional<int64_t>(to_int(key, v));
    if (p.max_tokens && *p.max_tokens < 1) fail(v.where, key + " must be >= 1, got " + v.text);
  } else if (key == "seed") {
    p.seed = null ? std::nullopt : std::optional<uint64_t>(to_uint(key, v));
  } else if (key == "repetition_penalty") {
    p.repetition_penalty = null ? std::nullopt : std::optional<double>(to_double(key, v));
    if (p.repetition_penalty && *p.repetition_penalty <= 0) {
      fail(v.where, key + " must be > 0, got " + v.text);
    }
  } else if (key == "stop_token_ids") {
    p.stop_token_ids = null ? std::vector<int64_t>{} : to_int_list(key, v);
    for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
      if (p.stop_token_ids[i] < 0) {
        fail(v.items[i].where, key + ": token ids are >= 0, got " + v.items[i].text);
      }
    }
  } else if (key == "greedy") {
    p.greedy = null ? std::nullopt : std::optional<bool>(to_bool(key, v));
  } else if (contains(kIgnoredSamplingKeys, key)) {
    s.engine.ignored["default_sampling_params." + key] = v.text;
  } else {
    return false;
  }
  return true;
}

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

namespace detail {

bool set_field(StageConfig& stage, Section section, const std::string& key, const RawValue& value,
               const SetContext& context) {
  switch (section) {
    case Section::kStage:
      return set_stage_key(stage, key, value);
    case Section::kEngine:
      return set_engine_key(stage.engine, key, value, context);
    case Section::kRuntime:
      return set_runtime_key(stage, key, value);
    case Section::kSampling:
      return set_sampling_key(stage, key, value);
  }
  return false;
}

const std::vector<std::string>& section_keys(Section section) {
  switch (section) {
    case Section::kStage:
      return kStageKeys;
    case Section::kEngine:
      return engine_keys();
    case Section::kRuntime:
      return kRuntimeKeys;
    case Section::kSampling:
      return kSamplingKeys;
  }
  return kStageKeys;
}

const std::vector<std::string>& section_ignored_keys(Section section) {
  return ignored_keys(section);
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::string best;
  size_t best_distance = 3;
  for (const auto& c : candidates) {
    const size_t d = levenshtein(w, lower(c));
    if (d < best_distance && d < std::max<size_t>(w.size(), 1)) {
      best = c;
      best_distance = d;
    }
  }
  if (!best.empty()) return best;
  for (const auto& c : candidates) {  // a prefix either way, the shortest such candidate
    const std::string lc = lower(c);
    const bool prefix =
        (w.size() >= 3 && lc.rfind(w, 0) == 0) || (lc.size() >= 4 && w.rfind(lc, 0) == 0);
    if (prefix && (best.empty() || c.size() < best.size())) best = c;
  }
  return best;
}

std::string unknown_key_message(const std::string& key, const std::string& what,
                                const std::vector<std::string>& known,
                                const std::vector<std::string>& ignored) {
  std::vector<std::string> all = known;
  all.insert(all.end(), ignored.begin(), ignored.end());
  const std::string close = closest_match(key, all);
  std::string message = "unknown key '" + key + "' in " + what;
  if (!close.empty()) return message + "; did you mean '" + close + "'?";
  message += " (known keys: " + join(known);
  if (!ignored.empty())
    message += "; and vLLM-Omni keys that have no effect here, such as " + ignored.front() +
               ": see stage_configs/README.md";
  return message + ")";
}

// The helpers the graph checks and the YAML reader share with the schema.
[[noreturn]] void fail(const std::string& where, const std::string& message) {
  config::fail(where, message);
}
std::string join(const std::vector<std::string>& items) { return config::join(items); }
std::vector<std::string> model_stage_names() {
  std::lock_guard<std::mutex> lock(model_stage_mutex());
  return model_stages();
}
const std::vector<std::string>& output_type_names() { return kOutputTypes; }

}  // namespace detail

void add_model_stage_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(model_stage_mutex());
  auto& names = model_stages();
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

}  // namespace omni::config
