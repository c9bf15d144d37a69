#include "worker/config/engine_options.h"

#include <algorithm>
#include <stdexcept>

#include "cpu_offload/option_names.h"
#include "worker/config/stage_values.h"

namespace omni::config {
namespace {

using detail::RawValue;
using detail::SetContext;
using Json = nlohmann::json;
using Type = EngineOption::Type;
template <typename T>
using Field = T StageEngineArgs::*;

bool is_null(const RawValue& v) { return v.kind == RawValue::Kind::kNull; }

// An option whose field `read` parses; the default is a default StageEngineArgs' field.
template <typename T, typename Read>
EngineOption option(std::string key, Field<T> field, Type type, std::vector<std::string> flags,
                    std::string value_name, std::string help, Read read) {
  EngineOption o;
  o.key = key;
  o.type = type;
  o.flags = std::move(flags);
  o.value_name = std::move(value_name);
  o.help = std::move(help);
  o.set = [key, field, read](StageEngineArgs& e, const RawValue& v, const SetContext& context) {
    if (is_null(v)) {
      const StageEngineArgs defaults;
      e.*field = defaults.*field;
    } else {
      e.*field = read(key, v, context);
    }
  };
  o.get = [field](const StageEngineArgs& e) { return Json(e.*field); };
  return o;
}

EngineOption switch_option(std::string key, Field<bool> field, std::vector<std::string> flags,
                           std::vector<std::string> negated, std::string help) {
  EngineOption o = option(std::move(key), field, Type::kFlag, std::move(flags), "", std::move(help),
                          [](const std::string& k, const RawValue& v, const SetContext&) {
                            return detail::to_bool(k, v);
                          });
  o.negated = std::move(negated);
  return o;
}

EngineOption choice(std::string key, Field<std::string> field,
                    const std::vector<std::string>& names, std::vector<std::string> flags,
                    std::string help) {
  std::string value_name;
  for (const auto& n : names) value_name += (value_name.empty() ? "" : "|") + n;
  return option(std::move(key), field, Type::kValue, std::move(flags), value_name, std::move(help),
                [names](const std::string& k, const RawValue& v, const SetContext&) {
                  return detail::one_of(k, v, names);
                });
}

EngineOption bytes(std::string key, Field<uint64_t> field, std::vector<std::string> flags,
                   std::string help) {
  return option(std::move(key), field, Type::kValue, std::move(flags), "BYTES", std::move(help),
                [](const std::string& k, const RawValue& v, const SetContext&) {
                  return detail::to_byte_size(k, v);
                });
}

// An integer of at least `min`.
EngineOption count(std::string key, Field<int64_t> field, int64_t min,
                   std::vector<std::string> flags, std::string help) {
  return option(std::move(key), field, Type::kValue, std::move(flags), "N", std::move(help),
                [min](const std::string& k, const RawValue& v, const SetContext&) {
                  const int64_t n = detail::to_int(k, v);
                  if (n < min) {
                    detail::fail(v.where, k + " must be >= " + std::to_string(min) + ", got " +
                                              std::to_string(n));
                  }
                  return n;
                });
}

EngineOption text(std::string key, Field<std::string> field) {
  return option(std::move(key), field, Type::kValue, {}, "", "",
                [](const std::string& k, const RawValue& v, const SetContext&) {
                  return detail::to_string(k, v);
                });
}

std::vector<EngineOption> make_options() {
  namespace names = offload::names;
  std::vector<EngineOption> t;
  // The kinds are read when a value is: families register theirs as the program starts.
  t.push_back(option("model_stage", &StageEngineArgs::model_stage, Type::kValue, {}, "KIND", "",
                     [](const std::string& k, const RawValue& v, const SetContext&) {
                       return detail::one_of(k, v, detail::model_stage_names());
                     }));
  t.push_back(text("model_arch", &StageEngineArgs::model_arch));
  t.push_back(option("model", &StageEngineArgs::model, Type::kValue, {}, "DIR", "",
                     [](const std::string& k, const RawValue& v, const SetContext& context) {
                       return detail::to_model_dir(k, v, context);
                     }));
  t.push_back(switch_option(
      "cpu_offload_enabled", &StageEngineArgs::cpu_offload_enabled, {"--cpu-offload-enabled"}, {},
      "component offload inside every stage, of the module names of --cpu-offload-components "
      "(default: visual and audio_tower)"));
  t.push_back(option(
      "cpu_offload_components", &StageEngineArgs::cpu_offload_components, Type::kList,
      {"--cpu-offload-components"}, "NAMES",
      "stage names (thinker, talker, code2wav) select stages that give the device back when "
      "another stage needs the room; other names (visual, audio_tower, language_model, lm_head, "
      "code_predictor, globs such as thinker.*) are modules offloaded inside every stage",
      [](const std::string& k, const RawValue& v, const SetContext&) {
        return detail::to_string_list(k, v);
      }));
  EngineOption strategy = choice(
      "cpu_offload_strategy", &StageEngineArgs::cpu_offload_strategy, names::component_policies(),
      {"--cpu-offload-strategy"},
      "alternating: a component leaves when another needs the room; sequential: right after its "
      "forward");
  strategy.needs_any = {"cpu_offload_components", "cpu_offload_enabled", "enable_cpu_offload"};
  t.push_back(std::move(strategy));
  t.push_back(switch_option("cpu_offload_pin_memory", &StageEngineArgs::cpu_offload_pin_memory,
                            {"--cpu-offload-pin-memory"},
                            {"--no-cpu-offload-pin-memory", "--no-pin-memory"},
                            "pinned host memory for offloaded weights (the default; --no-...: "
                            "pageable)"));
  t.push_back(switch_option("enable_cpu_offload", &StageEngineArgs::enable_cpu_offload,
                            {"--enable-cpu-offload"}, {},
                            "model-level offload: every stage gives its weights back when "
                            "another stage on its device needs the room"));
  t.push_back(switch_option("enable_layerwise_offload", &StageEngineArgs::enable_layerwise_offload,
                            {"--enable-layerwise-offload"}, {},
                            "stream the decoder layers of the thinker and the talker through "
                            "the device"));
  EngineOption ahead = option(
      "layerwise_num_gpu_layers", &StageEngineArgs::layerwise_num_gpu_layers, Type::kValue,
      {"--layerwise-num-gpu-layers"}, "N", "layerwise: layers copied ahead of the one computing",
      [](const std::string& k, const RawValue& v, const SetContext&) {
        const int64_t n = detail::to_int(k, v);
        if (n < 1) detail::fail(v.where, k + " must be >= 1, got " + std::to_string(n));
        return n;
      });
  ahead.needs_any = {"enable_layerwise_offload"};
  t.push_back(std::move(ahead));
  t.push_back(bytes("gpu_memory_budget", &StageEngineArgs::gpu_memory_budget,
                    {"--gpu-memory-budget", "--cpu-offload-budget"},
                    "device bytes the stages of a device may hold together (20GiB, 8GB, bytes; "
                    "0 = no budget)"));
  t.push_back(option("dtype", &StageEngineArgs::dtype, Type::kValue, {"--dtype"},
                     "auto|float32|bfloat16|float16",
                     "compute dtype; weights of another dtype are converted to it (auto: the "
                     "checkpoint's own)",
                     [](const std::string& k, const RawValue& v, const SetContext&) {
                       return detail::to_dtype(k, v);
                     }));
  t.back().get = [](const StageEngineArgs& e) { return Json(e.dtype.empty() ? "auto" : e.dtype); };
  t.push_back(switch_option("offload_stage", &StageEngineArgs::offload_stage, {}, {}, ""));
  t.push_back(switch_option("cpu_offload_experts", &StageEngineArgs::cpu_offload_experts,
                            {"--cpu-offload-experts"}, {},
                            "expert-level MoE offload: the thinker's experts live in a device "
                            "expert cache (fetched when routed, the next layer's predicted "
                            "experts prefetched)"));
  const std::vector<std::string> experts = {"cpu_offload_experts"};
  t.push_back(option("expert_cache_budget", &StageEngineArgs::expert_cache_budget, Type::kValue,
                     {"--expert-cache-budget"}, "PERCENT|BYTES",
                     "experts: device bytes of the expert cache, a percentage of all experts' "
                     "bytes (25%) or bytes (768MiB)",
                     [](const std::string& k, const RawValue& v, const SetContext&) {
                       return detail::to_expert_budget(k, v);
                     }));
  t.back().needs_any = experts;
  t.push_back(switch_option("expert_prefetch", &StageEngineArgs::expert_prefetch, {},
                            {"--no-expert-prefetch"},
                            "experts: do not predict and prefetch the next MoE layer's experts"));
  t.back().needs_any = experts;
  t.push_back(choice("expert_miss_policy", &StageEngineArgs::expert_miss_policy,
                     names::expert_miss_policies(), {"--expert-miss-policy"},
                     "experts: what a miss does: fetch it to the device, compute it on the host "
                     "where it lies, or auto (whichever the measured rates say is faster)"));
  t.back().needs_any = experts;
  t.push_back(choice("expert_eviction", &StageEngineArgs::expert_eviction,
                     names::expert_evictions(), {"--expert-eviction"},
                     "experts: which expert leaves a full cache: layer (by the layers' run "
                     "order) or lru"));
  t.back().needs_any = experts;
  t.push_back(bytes("host_memory_budget", &StageEngineArgs::host_memory_budget,
                    {"--host-memory-budget"},
                    "host bytes for the streamed weights (layerwise layers, experts); beyond it "
                    "they are read from the checkpoint's files when needed (0 = no limit)"));
  t.push_back(choice("disk_read", &StageEngineArgs::disk_read, names::disk_reads(), {"--disk-read"},
                     "how weights beyond --host-memory-budget are read: pread (a bounded pinned "
                     "cache, reader threads, read-ahead) or mmap (the OS page cache)"));
  t.push_back(count("max_num_seqs", &StageEngineArgs::max_num_seqs, 0, {"--max-num-seqs"},
                    "continuous batching: requests a stage decodes together (0: the stage's "
                    "runtime.max_batch_size)"));
  t.push_back(count("max_num_batched_tokens", &StageEngineArgs::max_num_batched_tokens, 1,
                    {"--max-num-batched-tokens"},
                    "continuous batching: prompt tokens a stage admits per step (the first "
                    "prompt always goes); with --enable-chunked-prefill, the tokens a step runs"));
  t.push_back(switch_option(
      "enable_chunked_prefill", &StageEngineArgs::enable_chunked_prefill,
      {"--enable-chunked-prefill"}, {},
      "continuous batching: a step runs at most --max-num-batched-tokens tokens, one per decoding "
      "request and the rest of prompts in chunks, so a long prompt does not stall the others"));
  t.push_back(count("block_size", &StageEngineArgs::block_size, 1, {"--block-size"},
                    "KV cache: tokens per block (a sequence holds at most one block it does not "
                    "use)"));
  t.push_back(bytes("kv_cache_memory_bytes", &StageEngineArgs::kv_cache_memory_bytes,
                    {"--kv-cache-memory-bytes"},
                    "KV cache: device bytes all requests' caches of a stage may take; a request "
                    "that does not fit waits (0 = no limit)"));
  return t;
}

}  // namespace

const std::vector<EngineOption>& engine_options() {
  static const std::vector<EngineOption> table = make_options();
  return table;
}

const EngineOption* find_engine_option(const std::string& key) {
  const auto& t = engine_options();
  const auto it =
      std::find_if(t.begin(), t.end(), [&](const EngineOption& o) { return o.key == key; });
  return it == t.end() ? nullptr : &*it;
}

Json engine_args_json(const StageEngineArgs& engine) {
  Json out = Json::object();
  for (const EngineOption& o : engine_options()) out[o.key] = o.get(engine);
  return out;
}

EngineFlag engine_flag(const std::string& key, std::vector<std::string> values) {
  const EngineOption* option = find_engine_option(key);
  if (option == nullptr || (option->flags.empty() && option->negated.empty())) {
    throw std::invalid_argument("no engine option flag for '" + key + "'");
  }
  return {key, option->flags.empty() ? option->negated.front() : option->flags.front(),
          std::move(values)};
}

std::optional<std::string> given_value(const EngineFlags& flags, const std::string& key) {
  std::optional<std::string> value;
  for (const EngineFlag& f : flags) {
    if (f.key == key && !f.values.empty()) value = f.values.back();
  }
  return value;
}

}  // namespace omni::config
