#include "worker/pipeline/local_pipeline.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "cpu_offload/check.h"
#include "cpu_offload/dtype_name.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "model_runner/runner/expert_offload.h"
#include "worker/config/engine_options.h"
#include "worker/pipeline/model_family.h"

namespace omni::pipeline {
config::PipelineConfig checkpoint_stage_config(const std::string& model_dir,
                                               const std::string& device,
                                               const std::string& dtype) {
  CheckpointGraphOptions o;
  o.model_dir = std::filesystem::absolute(model_dir).lexically_normal().string();
  o.devices = device == "cpu" ? "cpu" : "0";
  o.dtype = dtype == "auto" ? "" : dtype;
  o.where = "--model " + model_dir;
  config::PipelineConfig c = family_of_checkpoint(model_dir).checkpoint_graph(o);
  config::detail::validate_pipeline(c);
  return c;
}

std::unique_ptr<Pipeline> make_local_pipeline(const config::PipelineConfig& config,
                                              const std::string& device,
                                              const offload::TransferEngineOptions& engine) {
  std::vector<PipelineStage> stages;
  std::vector<std::shared_ptr<Stage>> runners;
  for (const auto& s : config.stages) {
    warn_ignored_engine_keys(s);
    LocalStageOptions options = local_stage_options(s, device);
    options.engine = engine;
    auto stage = std::shared_ptr<Stage>(make_local_stage(options));
    runners.push_back(stage);
    stages.push_back({s.stage_id, s.engine.model_stage, s.engine_input_source, stage,
                      s.custom_process_input_func});
  }
  auto p = std::make_unique<Pipeline>(std::move(stages));
  if (auto ledger = make_device_ledger(config, runners)) p->set_device_ledger(ledger);
  return p;
}

std::string stage_name(const config::StageConfig& stage) {
  return "stage " + std::to_string(stage.stage_id) + " (" + stage.engine.model_stage + ")";
}

std::vector<std::string> ignored_engine_keys(const config::StageConfig& stage) {
  const StageKind* kind = find_stage_kind(stage.engine.model_stage);
  std::vector<std::string> keys;
  if (kind == nullptr) return keys;
  const config::StageEngineArgs defaults;
  for (const config::EngineOption& o : config::engine_options()) {
    const auto& ignored = kind->ignored_keys;
    if (std::find(ignored.begin(), ignored.end(), o.key) == ignored.end()) continue;
    if (o.get(stage.engine) != o.get(defaults)) keys.push_back(o.key);
  }
  return keys;
}

void warn_ignored_engine_keys(const config::StageConfig& stage) {
  const auto keys = ignored_engine_keys(stage);
  if (keys.empty()) return;
  std::string list;
  for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
  log_warning(stage_name(stage), ": ", list, keys.size() == 1 ? " has" : " have",
              " no effect on a ", stage.engine.model_stage, " stage; ignored");
}

LocalStageOptions local_stage_options(const config::StageConfig& s, const std::string& device) {
  LocalStageOptions o;
  o.name = stage_name(s);
  o.model_stage = s.engine.model_stage;
  o.model_dir = s.engine.model;
  o.dtype = offload::scalar_type_of(s.engine.dtype);  // "" (auto): Undefined
  auto& off = o.offload;
  off.cpu_offload_enabled = s.engine.cpu_offload_enabled;
  off.components = s.engine.cpu_offload_components;
  off.strategy = s.engine.cpu_offload_strategy;
  off.pin_memory = s.engine.cpu_offload_pin_memory;
  off.device_budget_bytes = s.engine.gpu_memory_budget;
  off.layerwise = s.engine.enable_layerwise_offload;
  off.num_gpu_layers = static_cast<int>(s.engine.layerwise_num_gpu_layers);
  off.cpu_offload_experts = s.engine.cpu_offload_experts;
  models::parse_expert_cache_budget(s.engine.expert_cache_budget, "expert_cache_budget",
                                    &off.expert_cache_budget_bytes,
                                    &off.expert_cache_budget_fraction);
  off.expert_prefetch = s.engine.expert_prefetch;
  off.expert_miss_policy = s.engine.expert_miss_policy;
  off.expert_eviction = s.engine.expert_eviction;
  off.host_memory_budget_bytes = s.engine.host_memory_budget;
  off.disk_read = s.engine.disk_read;
  o.offload_stage = s.engine.offload_stage || s.engine.enable_cpu_offload;
  o.limits.max_num_seqs = s.max_num_seqs();
  o.limits.max_num_batched_tokens = s.engine.max_num_batched_tokens;
  o.limits.chunked_prefill = s.engine.enable_chunked_prefill;
  o.kv_block_size = s.engine.block_size;
  o.kv_cache_memory_bytes = s.engine.kv_cache_memory_bytes;
  const std::string kind = !device.empty() ? device : s.runtime.devices == "cpu" ? "cpu" : "cuda";
  o.device = offload::parse_device_kind(kind);
  return o;
}

std::shared_ptr<DeviceLedger> make_device_ledger(
    const config::PipelineConfig& config, const std::vector<std::shared_ptr<Stage>>& stages) {
  OMNI_CHECK(stages.size() == config.stages.size(), "make_device_ledger: ", stages.size(),
             " stages for a config of ", config.stages.size());
  // One budget per device: the smallest gpu_memory_budget of the stages on it (the global
  // --gpu-memory-budget sets them all). Local stages share the devices of this host; a remote
  // worker's device belongs to its host.
  std::map<std::string, uint64_t> budgets;
  std::vector<DeviceLedger::Member> members;
  bool any_budget = false;
  for (size_t i = 0; i < config.stages.size(); ++i) {
    const auto& s = config.stages[i];
    DeviceLedger::Member m;
    m.stage_id = s.stage_id;
    m.stage = stages[i].get();
    m.device = (s.runtime.address.empty() ? "local" : s.runtime.address) + "/" + s.runtime.devices;
    m.evictable = s.engine.offload_stage || s.engine.enable_cpu_offload;
    // What the stage holds on the device when loaded (with expert offload, less than all its
    // weights), and its KV pool.
    const StageInfo info = m.stage->info();
    m.bytes = info.device_weight_bytes + info.device_kv_bytes;
    m.kv_bytes = info.device_kv_bytes;
    const uint64_t budget = s.engine.gpu_memory_budget;
    if (budget > 0) {
      any_budget = true;
      auto& b = budgets[m.device];
      b = b == 0 ? budget : std::min(b, budget);
    }
    members.push_back(m);
  }
  // A device with stages that may leave (offload_stage, enable_cpu_offload) and no budget: those
  // stages exclude each other, as model-level offload's components do. The budget holds the
  // stages that stay plus the largest that moves.
  std::map<std::string, uint64_t> fixed, largest_moving;
  for (const auto& m : members) {
    auto& bytes = m.evictable ? largest_moving[m.device] : fixed[m.device];
    bytes = m.evictable ? std::max(bytes, m.bytes) : bytes + m.bytes;
  }
  for (const auto& [device, moving] : largest_moving) {
    if (budgets.count(device) == 0) budgets[device] = fixed[device] + moving;
  }
  if (!any_budget && largest_moving.empty()) return nullptr;
  return std::make_shared<DeviceLedger>(std::move(members), std::move(budgets));
}

}  // namespace omni::pipeline
