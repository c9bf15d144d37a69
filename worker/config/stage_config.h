// The stage configs of vLLM-Omni as plain structs, validated at the edge (the YAML reader is
// stage_yaml.h; a checkpoint's own stages are built directly).
//
// Two layouts are read into the same structs: `stage_args:` (engine keys nested under
// `engine_args`) and the flat `stages:` of the newer vLLM-Omni deploy files (engine keys directly
// in the stage item). Every problem is a ConfigError whose message starts with the position of
// the offending node, "FILE:LINE:COL: " (1-based), so that a user can jump to it. The rest of the
// code never sees YAML. stage_configs/README.md lists every key.
//
// This library depends on nlohmann-json and the standard library only (no LibTorch, no YAML).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace omni::config {

// Thrown for every config problem; what() is "FILE:LINE:COL: message" (or "--stage-overrides: ..."
// / "--flag: ..." for command-line sources).
class ConfigError : public std::runtime_error {
 public:
  using runtime_error::runtime_error;
};

struct SourceLocation {
  std::string file;
  int line = 0;             // 1-based; 0 = unknown
  int column = 0;           // 1-based
  std::string str() const;  // "file:line:col" ("file" alone when the line is unknown)
};

// default_sampling_params; unset = the stage's own default.
struct SamplingDefaults {
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k, max_tokens;
  std::optional<uint64_t> seed;
  std::vector<int64_t> stop_token_ids;
  std::optional<bool> greedy;  // our extension: argmax
};

struct StageRuntime {
  std::string devices = "0";  // "0" or "0,1"; "cpu" = the simulated device
  std::string address;        // "host:port" of an already running worker; empty = start a local one
  int64_t max_batch_size = 8;  // requests decoded together unless engine_args.max_num_seqs says
  std::string process;         // vLLM-Omni key, accepted, no effect
};

struct StageEngineArgs {
  std::string model_stage;  // thinker | talker | code2wav | diffusion (required)
  std::string model_arch;   // e.g. Qwen3OmniMoeForConditionalGeneration
  // Checkpoint directory, absolute (a relative one is resolved against the YAML file's folder).
  std::string model;
  bool cpu_offload_enabled = false;  // component offload inside the stage
  std::vector<std::string> cpu_offload_components = {"visual", "audio_tower"};
  std::string cpu_offload_strategy = "alternating";  // alternating | sequential
  bool cpu_offload_pin_memory = true;
  // Model-level offload (diffusion); for an AR stage: the whole stage is one component that gives
  // the device back between requests.
  bool enable_cpu_offload = false;
  bool enable_layerwise_offload = false;
  int64_t layerwise_num_gpu_layers = 1;  // >= 1
  // Bytes; 0 = none. YAML: an integer, or a string with a suffix KB/MB/GB/TB (powers of 1000) or
  // KiB/MiB/GiB/TiB (powers of 1024), e.g. 20GiB.
  uint64_t gpu_memory_budget = 0;
  std::string dtype;  // "" (auto) = the checkpoint's; float32 | bfloat16 | float16 (normalised)
  // The stage's weights leave the device when another stage on the same device needs room. Set by
  // the global --cpu-offload-components when it names this stage (thinker/talker/code2wav).
  bool offload_stage = false;
  // Expert-level MoE offload of the thinker's experts (a device expert cache; the rest of each
  // layer follows the offload above). expert_cache_budget: "25%" (of all experts' bytes), or
  // bytes as gpu_memory_budget takes them (805306368, 768MiB). expert_miss_policy: fetch | host |
  // auto. expert_prefetch: predict and prefetch the next MoE layer's experts.
  bool cpu_offload_experts = false;
  std::string expert_cache_budget = "25%";
  bool expert_prefetch = true;
  std::string expert_miss_policy = "fetch";
  // Which expert leaves a full device cache: lru | layer (the MoE layers' run order).
  std::string expert_eviction = "layer";
  // The disk tier: host bytes the streamed weights (layerwise layers, experts) may take, 0 = no
  // limit; beyond it they are read from the checkpoint's files (pread into a bounded pinned
  // cache, or mmap: copies from the file's mapping).
  uint64_t host_memory_budget = 0;
  std::string disk_read = "pread";
  // Continuous batching: requests decoded together (0: runtime.max_batch_size), prompt tokens
  // admitted per step, KV block size in tokens, and the KV cache's device bytes (0: no limit).
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 8192;
  // Prompts run in chunks of what max_num_batched_tokens leaves beside the decoding rows.
  bool enable_chunked_prefill = false;
  int64_t block_size = 16;
  uint64_t kv_cache_memory_bytes = 0;
  // vLLM-Omni keys that are read and have no effect here, with their raw text for logging: the
  // engine_args keys by name, the stage keys too, "runtime.KEY" and
  // "default_sampling_params.KEY" for those sections' (README lists them).
  std::map<std::string, std::string> ignored;
};

struct StageConfig {
  int64_t stage_id = -1;
  std::string stage_type = "llm";  // llm | generation | diffusion
  StageRuntime runtime;
  StageEngineArgs engine;
  std::vector<int64_t> engine_input_source;  // stage ids this stage reads from
  bool final_output = false;
  std::string final_output_type;          // text | audio | image (required when final_output)
  SamplingDefaults sampling;              // default_sampling_params
  std::string custom_process_input_func;  // the hand-off by name (pipeline/stage_kind.h)
  bool is_comprehension = false;          // vLLM-Omni key; accepted
  SourceLocation location;                // where the stage's mapping starts

  // Requests the stage runs together: engine_args.max_num_seqs, else runtime.max_batch_size.
  int64_t max_num_seqs() const {
    return engine.max_num_seqs > 0 ? engine.max_num_seqs : runtime.max_batch_size;
  }
};

struct PipelineConfig {
  std::string path;                 // the YAML file ("<string>" when parsed from text)
  std::vector<StageConfig> stages;  // in file order
  // Known top-level vLLM-Omni keys that have no effect here (async_chunk, connectors, ...), raw.
  std::map<std::string, std::string> ignored;

  const StageConfig& stage(int64_t id) const;      // throws ConfigError naming the id and known ids
  std::vector<int64_t> topological_order() const;  // sources before consumers, else file order
  std::vector<int64_t> entry_stages() const;       // empty engine_input_source, in file order
};

// The model_stage values a config may name: the stage kinds of the model families linked into
// this program, added as each registers (worker/pipeline/model_family.h), in that order. A program
// without families (a test of the schema alone) adds its own.
void add_model_stage_name(const std::string& name);

// Shared by the YAML parser and the command-line overrides (stage_overrides.cc); not an API.
namespace detail {

// One value read from YAML, JSON or a typed flag, with the prefix its errors carry.
struct RawValue {
  enum class Kind { kNull, kScalar, kSequence, kMapping };
  Kind kind = Kind::kNull;
  std::string text;             // a scalar's text; for a sequence or mapping its flow-style text
  bool quoted = false;          // a string in the source (quoted YAML scalar, JSON string)
  std::vector<RawValue> items;  // a sequence's items
  std::string where;            // "FILE:LINE:COL", "--stage-overrides: stage 0", "--dtype"
};

enum class Section { kStage, kEngine, kRuntime, kSampling };

struct SetContext {
  std::string base_dir;  // resolves a relative `model`
  bool check_model_dirs = true;
};

// Sets `key` of `section` in `stage` from `value` (null = the field's default), checking type
// and range; throws ConfigError prefixed with value.where. Returns false when `key` is not a key
// of that section (the caller reports it). Stage-section keys that are structure (stage_id,
// runtime, engine_args, engine_input_source, default_sampling_params) are not handled here.
bool set_field(StageConfig& stage, Section section, const std::string& key, const RawValue& value,
               const SetContext& context);

// The keys `section` gives a meaning to, and the vLLM-Omni keys it accepts and ignores.
const std::vector<std::string>& section_keys(Section section);
const std::vector<std::string>& section_ignored_keys(Section section);
// "unknown key 'K' in WHAT; did you mean 'X'?" (X from `known` or `ignored`), or, when nothing
// is close, the `known` keys listed.
std::string unknown_key_message(const std::string& key, const std::string& what,
                                const std::vector<std::string>& known,
                                const std::vector<std::string>& ignored);
// The closest of `candidates` (Levenshtein <= 2, else a prefix match), or "".
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// The schema's shared helpers (stage_fields.cc).
[[noreturn]] void fail(const std::string& where, const std::string& message);
std::string join(const std::vector<std::string>& items);  // "a, b, c"
int64_t to_int(const std::string& key, const RawValue& value);
std::vector<int64_t> to_int_list(const std::string& key, const RawValue& value);
std::string to_dtype(const std::string& key, const RawValue& value);  // normalised; "" = auto
std::vector<std::string> model_stage_names();  // add_model_stage_name's, a copy
const std::vector<std::string>& output_type_names();

// Where each stage's checked parts are, for messages: YAML positions, or the stage's location.
struct StageMarks {
  std::string stage;                 // the stage mapping
  std::string stage_id;              // its stage_id value
  std::string required;              // where a missing model / model_stage is reported
  std::string final_output;          // its final_output value
  std::vector<std::string> sources;  // each engine_input_source item
};

// The whole-pipeline checks of validate_pipeline with the positions the reader recorded;
// `list_where` is where problems of the whole list are reported.
void validate_stages(const PipelineConfig& config, const std::vector<StageMarks>& marks,
                     const std::string& list_where);

// Whole-pipeline checks (ids, graph, entry and final stages, required keys); errors name the
// stage's location. Run after the YAML and again after the overrides.
void validate_pipeline(const PipelineConfig& config);

}  // namespace detail
}  // namespace omni::config
