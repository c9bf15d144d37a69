#include "worker/config/stage_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "cpu_offload/option_names.h"
#include "worker/config/stage_overrides.h"

namespace omni::config {
namespace {

namespace fs = std::filesystem;
using detail::RawValue;
using detail::Section;
using detail::SetContext;
using Kind = RawValue::Kind;

// --- key tables --------------------------------------------------------------------------------

const std::vector<std::string> kModelStages = {"thinker", "talker", "code2wav", "diffusion"};
const std::vector<std::string> kStageTypes = {"llm", "generation", "diffusion"};
const std::vector<std::string> kOutputTypes = {"text", "audio", "image"};
const std::vector<std::string> kDtypes = {"float32", "bfloat16", "float16"};

// clang-format off
// The keys each section gives a meaning to.
const std::vector<std::string> kStageKeys = {
    "stage_id", "stage_type", "runtime", "engine_args", "engine_input_source", "final_output",
    "final_output_type", "default_sampling_params", "custom_process_input_func",
    "is_comprehension"};
const std::vector<std::string> kEngineKeys = {
    "model_stage", "model_arch", "model", "cpu_offload_enabled", "cpu_offload_components",
    "cpu_offload_strategy", "cpu_offload_pin_memory", "enable_cpu_offload",
    "enable_layerwise_offload", "layerwise_num_gpu_layers", "gpu_memory_budget", "dtype",
    "offload_stage", "cpu_offload_experts", "expert_cache_budget", "expert_prefetch",
    "expert_miss_policy", "expert_eviction", "host_memory_budget", "disk_read"};
const std::vector<std::string> kRuntimeKeys = {"devices", "address", "max_batch_size", "process"};
const std::vector<std::string> kSamplingKeys = {
    "temperature", "top_p", "top_k", "max_tokens", "seed", "repetition_penalty",
    "stop_token_ids", "greedy"};
const std::vector<std::string> kTopLevelKeys = {"stage_args", "stages", "dtype"};

// vLLM / vLLM-Omni keys read and ignored (kept raw in StageEngineArgs::ignored and
// PipelineConfig::ignored). stage_configs/README.md lists them: keep the two in step.
const std::vector<std::string> kIgnoredStageKeys = {
    "custom_process_next_stage_input_func", "input_connectors", "output_connectors",
    "num_replicas", "env", "async_chunk", "default_pooling_params", "engine_extras",
    "subtalker_sampling_params", "silence_ban_frames", "prompt_expand_func"};
const std::vector<std::string> kIgnoredEngineKeys = {
    "worker_cls", "scheduler_cls", "worker_type", "gpu_memory_utilization", "enforce_eager",
    "trust_remote_code", "engine_output_type", "distributed_executor_backend",
    "enable_prefix_caching", "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs",
    "max_model_len", "hf_config_name", "tensor_parallel_size", "pipeline_parallel_size",
    "data_parallel_size", "enable_expert_parallel", "load_format", "async_scheduling",
    "quantization", "kv_cache_dtype", "block_size", "swap_space", "seed", "tokenizer",
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
const std::vector<std::string> kIgnoredTopLevelKeys = {
    "async_chunk", "runtime", "connectors", "edges", "platforms", "pipeline", "session_mode",
    "model_runner", "active_stream_window", "duplex_session", "trust_remote_code",
    "distributed_executor_backend", "quantization", "enable_prefix_caching",
    "enable_chunked_prefill", "data_parallel_size", "pipeline_parallel_size", "custom_voice_dir"};
// clang-format on

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

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

std::vector<int64_t> ids_of(const PipelineConfig& config) {
  std::vector<int64_t> ids;
  for (const auto& stage : config.stages) ids.push_back(stage.stage_id);
  return ids;
}

// --- typed values ------------------------------------------------------------------------------

std::string describe(const RawValue& v) {
  switch (v.kind) {
    case Kind::kNull:
      return "nothing";
    case Kind::kSequence:
      return "a list";
    case Kind::kMapping:
      return "a mapping";
    case Kind::kScalar:
      break;
  }
  return v.quoted ? "the string \"" + v.text + "\"" : "'" + v.text + "'";
}

[[noreturn]] void wrong_type(const std::string& key, const RawValue& v, const std::string& what) {
  fail(v.where, key + ": expected " + what + ", got " + describe(v));
}

bool to_bool(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const std::string s = lower(v.text);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  wrong_type(key, v, "a boolean (true or false)");
}

int64_t to_int(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (begin != end && *begin == '+') ++begin;
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc::result_out_of_range)
      fail(v.where, key + ": " + v.text + " is out of range");
    if (ec == std::errc() && ptr == end && begin != end) return value;
  }
  wrong_type(key, v, "an integer");
}

uint64_t to_uint(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted && !v.text.empty() && v.text[0] != '-') {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (*begin == '+') ++begin;
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc::result_out_of_range)
      fail(v.where, key + ": " + v.text + " is out of range");
    if (ec == std::errc() && ptr == end && begin != end) return value;
  }
  if (v.kind == Kind::kScalar && !v.quoted) {
    int64_t negative = to_int(key, v);  // an integer below zero, or the type error
    fail(v.where, key + " must be >= 0, got " + std::to_string(negative));
  }
  wrong_type(key, v, "a non-negative integer");
}

double to_double(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (begin != end && *begin == '+') ++begin;
    double value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end && begin != end && std::isfinite(value)) return value;
  }
  wrong_type(key, v, "a number");
}

std::string to_string(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a string");
  return v.text;
}

std::vector<int64_t> to_int_list(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kSequence) wrong_type(key, v, "a list of integers, e.g. [0]");
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(to_int(key, item));
  return out;
}

// A list of strings, or one string of comma-separated names.
std::vector<std::string> to_string_list(const std::string& key, const RawValue& v) {
  std::vector<std::string> out;
  if (v.kind == Kind::kSequence) {
    for (const auto& item : v.items) {
      std::string s = trim(to_string(key, item));
      if (s.empty()) fail(item.where, key + ": an empty name");
      out.push_back(s);
    }
    return out;
  }
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a list of strings");
  std::stringstream in(v.text);
  for (std::string part; std::getline(in, part, ',');) {
    part = trim(part);
    if (part.empty()) fail(v.where, key + ": an empty name in '" + v.text + "'");
    out.push_back(part);
  }
  return out;
}

std::string one_of(const std::string& key, const RawValue& v,
                   const std::vector<std::string>& valid) {
  const std::string s = to_string(key, v);
  if (contains(valid, s)) return s;
  std::string message = key + ": unknown value '" + s + "'";
  const std::string close = detail::closest_match(s, valid);
  if (!close.empty()) message += "; did you mean '" + close + "'?";
  fail(v.where, message + " (valid: " + join(valid) + ")");
}

std::string to_dtype(const std::string& key, const RawValue& v) {
  const std::string s = lower(trim(to_string(key, v)));
  if (s == "float32" || s == "float" || s == "fp32") return "float32";
  if (s == "bfloat16" || s == "bf16") return "bfloat16";
  if (s == "float16" || s == "fp16" || s == "half") return "float16";
  if (s == "auto" || s.empty()) return "";
  RawValue named = v;
  named.text = s;
  return one_of(key, named, kDtypes);  // fails with the suggestion
}

std::string to_devices(const std::string& key, const RawValue& v) {
  const std::string s = trim(to_string(key, v));
  bool ok = !s.empty();
  if (s != "cpu") {
    std::stringstream in(s);
    for (std::string part; ok && std::getline(in, part, ',');) {
      part = trim(part);
      ok = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
    }
    ok = ok && s.back() != ',';
  }
  if (!ok) {
    fail(v.where,
         key + ": expected \"cpu\" or device indices such as \"0\" or \"0,1\", got " + describe(v));
  }
  return s;
}

std::string to_address(const std::string& key, const RawValue& v) {
  const std::string s = trim(to_string(key, v));
  if (s.empty()) return s;
  const auto colon = s.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < s.size();
  if (ok) {
    const std::string port = s.substr(colon + 1);
    ok = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c));
         });
    ok = ok && std::stoi(port) >= 1 && std::stoi(port) <= 65535;
  }
  if (!ok) fail(v.where, key + ": expected \"host:port\" (port 1-65535), got " + describe(v));
  return s;
}

std::string to_model_dir(const std::string& key, const RawValue& v, const SetContext& context) {
  const std::string given = trim(to_string(key, v));
  if (given.empty()) fail(v.where, key + ": empty (the checkpoint directory)");
  fs::path path(given);
  if (path.is_relative()) path = fs::path(context.base_dir) / path;
  path = fs::absolute(path).lexically_normal();
  if (path.has_parent_path() && path.filename().empty()) path = path.parent_path();
  const std::string resolved = path.string();
  if (context.check_model_dirs) {
    std::error_code ec;
    const std::string from = fs::path(given).is_relative()
                                 ? " ('" + given + "' resolved against '" + context.base_dir + "')"
                                 : "";
    if (!fs::exists(path, ec)) {
      fail(v.where, key + ": the directory '" + resolved + "' does not exist" + from);
    }
    if (!fs::is_directory(path, ec)) {
      fail(v.where, key + ": '" + resolved + "' is not a directory" + from);
    }
  }
  return resolved;
}

uint64_t to_byte_size(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a byte size (an integer or e.g. \"20GiB\")");
  try {
    return parse_byte_size(v.text);
  } catch (const std::invalid_argument& e) {
    fail(v.where, key + ": " + e.what());
  }
}

// "25%" (of all experts' bytes, in (0, 100]) as is; a byte size as its decimal bytes.
std::string to_expert_budget(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) {
    wrong_type(key, v, "a percentage of the experts' bytes (\"25%\") or a byte size");
  }
  const std::string text = trim(v.text);
  if (!text.empty() && text.back() == '%') {
    double percent = 0;
    size_t used = 0;
    try {
      percent = std::stod(text.substr(0, text.size() - 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() - 1 || !(percent > 0 && percent <= 100)) {
      fail(v.where, key + ": '" + text + "' must be a percentage in (0%, 100%]");
    }
    return text;
  }
  const uint64_t bytes = to_byte_size(key, v);
  if (bytes == 0) fail(v.where, key + ": 0 bytes (give a percentage such as 25%, or bytes)");
  return std::to_string(bytes);
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
  const StageEngineArgs d;
  const bool null = v.kind == Kind::kNull;
  if (key == "model_stage") {
    e.model_stage = null ? d.model_stage : one_of(key, v, kModelStages);
  } else if (key == "model_arch") {
    e.model_arch = null ? d.model_arch : to_string(key, v);
  } else if (key == "model") {
    e.model = null ? d.model : to_model_dir(key, v, context);
  } else if (key == "cpu_offload_enabled") {
    e.cpu_offload_enabled = null ? d.cpu_offload_enabled : to_bool(key, v);
  } else if (key == "cpu_offload_components") {
    e.cpu_offload_components = null ? d.cpu_offload_components : to_string_list(key, v);
  } else if (key == "cpu_offload_strategy") {
    e.cpu_offload_strategy =
        null ? d.cpu_offload_strategy : one_of(key, v, offload::names::component_policies());
  } else if (key == "cpu_offload_pin_memory") {
    e.cpu_offload_pin_memory = null ? d.cpu_offload_pin_memory : to_bool(key, v);
  } else if (key == "enable_cpu_offload") {
    e.enable_cpu_offload = null ? d.enable_cpu_offload : to_bool(key, v);
  } else if (key == "enable_layerwise_offload") {
    e.enable_layerwise_offload = null ? d.enable_layerwise_offload : to_bool(key, v);
  } else if (key == "layerwise_num_gpu_layers") {
    e.layerwise_num_gpu_layers = null ? d.layerwise_num_gpu_layers : to_int(key, v);
    if (e.layerwise_num_gpu_layers < 1) {
      fail(v.where, key + " must be >= 1, got " + std::to_string(e.layerwise_num_gpu_layers));
    }
  } else if (key == "gpu_memory_budget") {
    e.gpu_memory_budget = null ? d.gpu_memory_budget : to_byte_size(key, v);
  } else if (key == "dtype") {
    e.dtype = null ? d.dtype : to_dtype(key, v);
  } else if (key == "offload_stage") {
    e.offload_stage = null ? d.offload_stage : to_bool(key, v);
  } else if (key == "cpu_offload_experts") {
    e.cpu_offload_experts = null ? d.cpu_offload_experts : to_bool(key, v);
  } else if (key == "expert_cache_budget") {
    e.expert_cache_budget = null ? d.expert_cache_budget : to_expert_budget(key, v);
  } else if (key == "expert_prefetch") {
    e.expert_prefetch = null ? d.expert_prefetch : to_bool(key, v);
  } else if (key == "expert_miss_policy") {
    e.expert_miss_policy =
        null ? d.expert_miss_policy : one_of(key, v, offload::names::expert_miss_policies());
  } else if (key == "expert_eviction") {
    e.expert_eviction =
        null ? d.expert_eviction : one_of(key, v, offload::names::expert_evictions());
  } else if (key == "host_memory_budget") {
    e.host_memory_budget = null ? d.host_memory_budget : to_byte_size(key, v);
  } else if (key == "disk_read") {
    e.disk_read = null ? d.disk_read : one_of(key, v, offload::names::disk_reads());
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

// --- whole-pipeline checks ---------------------------------------------------------------------

// Where each stage's checked parts are, for messages: YAML positions, or the stage's location.
struct StageMarks {
  std::string stage;                 // the stage mapping
  std::string stage_id;              // its stage_id value
  std::string required;              // where a missing model / model_stage is reported
  std::string final_output;          // its final_output value
  std::vector<std::string> sources;  // each engine_input_source item
};

// A cycle of the graph where stage i reads the stages reads[i], found by a depth-first walk: the
// stage indices in data-flow order (first == last), or empty when there is none.
std::vector<size_t> find_cycle(const std::vector<std::vector<size_t>>& reads) {
  const size_t n = reads.size();
  std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<size_t> path;
  std::vector<size_t> cycle;
  std::function<bool(size_t)> visit = [&](size_t i) {
    color[i] = 1;
    path.push_back(i);
    for (size_t j : reads[i]) {
      if (color[j] == 1) {
        auto it = std::find(path.begin(), path.end(), j);
        cycle.assign(it, path.end());
        cycle.push_back(j);
        std::reverse(cycle.begin(), cycle.end());  // i reads j: data flows j -> i
        return true;
      }
      if (color[j] == 0 && visit(j)) return true;
    }
    path.pop_back();
    color[i] = 2;
    return false;
  };
  for (size_t i = 0; i < n; ++i) {
    if (color[i] == 0 && visit(i)) return cycle;
  }
  return {};
}

void validate(const PipelineConfig& config, const std::vector<StageMarks>& marks,
              const std::string& list_where) {
  const auto& stages = config.stages;
  if (stages.empty()) fail(list_where, "the pipeline has no stages");
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < stages.size(); ++i) {
    const int64_t id = stages[i].stage_id;
    if (id < 0) fail(marks[i].stage_id, "stage_id must be >= 0, got " + std::to_string(id));
    const auto [it, inserted] = index.emplace(id, i);
    if (!inserted) {
      fail(marks[i].stage_id, "stage_id " + std::to_string(id) + " is used twice (first at " +
                                  marks[it->second].stage_id + ")");
    }
  }
  const std::vector<int64_t> ids = ids_of(config);
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageConfig& s = stages[i];
    const std::string name = "stage " + std::to_string(s.stage_id);
    if (s.engine.model_stage.empty()) {
      fail(marks[i].required, name + " has no model_stage (" + join(kModelStages) + ")");
    }
    if (s.engine.model.empty()) {
      fail(marks[i].required, name + " has no model (the checkpoint directory)");
    }
    if (s.final_output && s.final_output_type.empty()) {
      const std::string types = join(kOutputTypes);
      fail(marks[i].final_output,
           name + ": final_output is true but final_output_type is not set (" + types + ")");
    }
    std::set<int64_t> seen;
    for (size_t j = 0; j < s.engine_input_source.size(); ++j) {
      const int64_t source = s.engine_input_source[j];
      const std::string& where = j < marks[i].sources.size() ? marks[i].sources[j] : marks[i].stage;
      if (source == s.stage_id) fail(where, name + " lists itself in engine_input_source");
      if (!index.count(source)) {
        fail(where, "engine_input_source: no stage " + std::to_string(source) +
                        " (stages: " + join_ids(ids) + ")");
      }
      if (!seen.insert(source).second) {
        fail(where, "engine_input_source lists stage " + std::to_string(source) + " twice");
      }
    }
  }
  if (config.entry_stages().empty()) {
    fail(list_where,
         "no entry stage: every stage has an engine_input_source, so none reads "
         "the request");
  }
  std::vector<std::vector<size_t>> reads(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    for (int64_t source : stages[i].engine_input_source) reads[i].push_back(index.at(source));
  }
  const std::vector<size_t> cycle = find_cycle(reads);
  if (!cycle.empty()) {
    std::string path;
    for (size_t i : cycle) {
      path += (path.empty() ? "" : " -> ") + ("stage " + std::to_string(stages[i].stage_id));
    }
    fail(marks[cycle.front()].stage, "engine_input_source forms a cycle: " + path);
  }
  if (std::none_of(stages.begin(), stages.end(), [](const auto& s) { return s.final_output; })) {
    fail(list_where, "no stage has final_output: true, so a request would never finish");
  }
}

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
      const std::string value = to_dtype("dtype", *dtype);
      for (auto& stage : config.stages) {
        if (stage.engine.dtype.empty()) stage.engine.dtype = value;
      }
    }
    validate(config, marks, list->key_where);
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
        stage.stage_id = to_int(key, raw(e));
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
            v.kind == Kind::kNull ? std::vector<int64_t>{} : to_int_list(key, v);
        marks.sources.clear();
        for (const auto& source : v.items) marks.sources.push_back(source.where);
      } else if (set_stage_key(stage, key, raw(e))) {
        if (key == "final_output") marks.final_output = e.value_where;
      } else if (flat && (contains(kEngineKeys, key) || contains(kIgnoredEngineKeys, key))) {
        set(stage, Section::kEngine, e, "a stage", engine_seen);
      } else if (flat && contains(kRuntimeKeys, key)) {
        set(stage, Section::kRuntime, e, "a stage", runtime_seen);
      } else if (!flat && (contains(kEngineKeys, key) || contains(kIgnoredEngineKeys, key))) {
        const std::string message = "'" + key +
                                    "' belongs under engine_args in the 'stage_args' "
                                    "layout (the flat 'stages' layout puts it in the stage)";
        fail(e.key_where, message);
      } else if (!flat && contains(kRuntimeKeys, key)) {
        fail(e.key_where, "'" + key + "' belongs under runtime");
      } else {
        std::vector<std::string> known = kStageKeys;
        std::vector<std::string> ignored = kIgnoredStageKeys;
        if (flat) {
          known.insert(known.end(), kEngineKeys.begin(), kEngineKeys.end());
          known.insert(known.end(), kRuntimeKeys.begin(), kRuntimeKeys.end());
          ignored.insert(ignored.end(), kIgnoredEngineKeys.begin(), kIgnoredEngineKeys.end());
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

// --- public API --------------------------------------------------------------------------------

std::string SourceLocation::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

const StageConfig& PipelineConfig::stage(int64_t id) const {
  for (const auto& s : stages) {
    if (s.stage_id == id) return s;
  }
  throw ConfigError(path + ": no stage " + std::to_string(id) +
                    " (stages: " + join_ids(ids_of(*this)) + ")");
}

std::vector<int64_t> PipelineConfig::topological_order() const {
  std::vector<int64_t> order;
  std::set<int64_t> done;
  std::vector<bool> placed(stages.size(), false);
  // Kahn's algorithm; among the ready stages the first in the file goes first.
  for (bool progress = true; progress && order.size() < stages.size();) {
    progress = false;
    for (size_t i = 0; i < stages.size(); ++i) {
      if (placed[i]) continue;
      const auto& sources = stages[i].engine_input_source;
      if (std::all_of(sources.begin(), sources.end(),
                      [&](int64_t id) { return done.count(id) > 0; })) {
        placed[i] = true;
        done.insert(stages[i].stage_id);
        order.push_back(stages[i].stage_id);
        progress = true;
        break;
      }
    }
  }
  for (size_t i = 0; i < stages.size(); ++i) {  // only an unvalidated config has leftovers
    if (!placed[i]) order.push_back(stages[i].stage_id);
  }
  return order;
}

std::vector<int64_t> PipelineConfig::entry_stages() const {
  std::vector<int64_t> entries;
  for (const auto& s : stages) {
    if (s.engine_input_source.empty()) entries.push_back(s.stage_id);
  }
  return entries;
}

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
      return kEngineKeys;
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

void validate_pipeline(const PipelineConfig& config) {
  std::vector<StageMarks> marks;
  for (const auto& stage : config.stages) {
    const std::string where = stage.location.str();
    marks.push_back({where, where, where, where, {}});
  }
  validate(config, marks, config.path);
}

}  // namespace detail
}  // namespace omni::config
