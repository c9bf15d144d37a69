#include "worker/pipeline/stage_launcher.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "model_runner/runner/expert_offload.h"

namespace omni::pipeline {
namespace {

using Json = nlohmann::json;

// A local worker seen through its supervisor: each call goes to the worker's current address,
// so that after a restart (new port) the next request reaches the new process. A request that
// arrives while the worker restarts waits for it (up to the start-up timeout).
class SupervisedStage : public Stage {
 public:
  SupervisedStage(WorkerSupervisor& supervisor, size_t index, std::string name,
                  rpc::ClientOptions client, std::chrono::milliseconds ready_timeout)
      : supervisor_(supervisor),
        index_(index),
        name_(std::move(name)),
        client_(std::move(client)),
        ready_timeout_(ready_timeout) {
    client_.name = name_;
  }

  const std::string& name() const override { return name_; }
  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    current()->run(call, input, sink, cancel);
  }
  std::string stats_json() override { return current()->stats_json(); }
  std::string info_json() override { return current()->info_json(); }
  uint64_t set_device_released(bool release) override {
    return current()->set_device_released(release);
  }
  uint64_t device_bytes() override { return current()->device_bytes(); }

 private:
  std::shared_ptr<rpc::RemoteStage> current() {
    std::string address;
    try {
      address = supervisor_.wait_ready(index_, ready_timeout_);
    } catch (const std::exception& e) {
      throw StageError(StageError::Code::kUnavailable, name_,
                       std::string("the worker is not running: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!client_for_ || client_for_->address() != address) {
      client_for_ = std::make_shared<rpc::RemoteStage>(address, client_);
    }
    return client_for_;
  }

  WorkerSupervisor& supervisor_;
  size_t index_;
  std::string name_;
  rpc::ClientOptions client_;
  std::chrono::milliseconds ready_timeout_;
  std::mutex mutex_;
  std::shared_ptr<rpc::RemoteStage> client_for_;
};

}  // namespace

std::string stage_name(const config::StageConfig& stage) {
  return "stage " + std::to_string(stage.stage_id) + " (" + stage.engine.model_stage + ")";
}

std::string resolved_stage_overrides(const config::StageConfig& s) {
  const auto& e = s.engine;
  Json engine = {{"model", e.model},
                 {"cpu_offload_enabled", e.cpu_offload_enabled},
                 {"cpu_offload_components", e.cpu_offload_components},
                 {"cpu_offload_strategy", e.cpu_offload_strategy},
                 {"cpu_offload_pin_memory", e.cpu_offload_pin_memory},
                 {"enable_cpu_offload", e.enable_cpu_offload},
                 {"enable_layerwise_offload", e.enable_layerwise_offload},
                 {"layerwise_num_gpu_layers", e.layerwise_num_gpu_layers},
                 {"gpu_memory_budget", e.gpu_memory_budget},
                 {"offload_stage", e.offload_stage},
                 {"cpu_offload_experts", e.cpu_offload_experts},
                 {"expert_cache_budget", e.expert_cache_budget},
                 {"expert_prefetch", e.expert_prefetch},
                 {"expert_miss_policy", e.expert_miss_policy},
                 {"expert_eviction", e.expert_eviction},
                 {"host_memory_budget", e.host_memory_budget},
                 {"disk_read", e.disk_read}};
  if (!e.dtype.empty()) engine["dtype"] = e.dtype;
  engine["runtime"] = Json{{"devices", s.runtime.devices}};
  return Json{{std::to_string(s.stage_id), engine}}.dump();
}

namespace {

// "" (auto) is handled by the caller: the runner then reads the checkpoint's dtype.
at::ScalarType dtype_of(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  return at::kFloat;  // float32 (the config normalises the names)
}

}  // namespace

LocalStageOptions local_stage_options(const config::StageConfig& s, const std::string& device) {
  LocalStageOptions o;
  o.name = stage_name(s);
  o.model_stage = s.engine.model_stage;
  o.model_dir = s.engine.model;
  o.dtype = s.engine.dtype.empty() ? at::ScalarType::Undefined : dtype_of(s.engine.dtype);
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
  const std::string kind = !device.empty() ? device : s.runtime.devices == "cpu" ? "cpu" : "cuda";
  o.device = offload::parse_device_kind(kind);
  return o;
}

StageLauncher::StageLauncher(LauncherOptions options) : options_(std::move(options)) {
  const auto& config = options_.config;
  rpc::ClientOptions client;
  client.token = options_.token;
  client.tls_ca_file = options_.tls_ca_file;

  // Local workers first, all at once (their start-up overlaps).
  std::vector<WorkerSpec> specs;
  for (const auto& s : config.stages) {
    if (!s.runtime.address.empty()) continue;
    OMNI_CHECK(!options_.worker_executable.empty(), stage_name(s),
               " has no runtime.address and no worker executable was given to start it");
    WorkerSpec spec;
    spec.name = stage_name(s);
    spec.argv = {options_.worker_executable,
                 "worker",
                 "--stage-configs-path",
                 config.path,
                 "--stage-id",
                 std::to_string(s.stage_id),
                 "--listen",
                 "127.0.0.1:0",
                 "--stage-overrides",
                 resolved_stage_overrides(s)};
    spec.startup_timeout = options_.init_timeout;
    if (!options_.log_dir.empty()) {
      spec.log_path = (std::filesystem::path(options_.log_dir) /
                       ("stage-" + std::to_string(s.stage_id) + ".log"))
                          .string();
    }
    local_index_.emplace_back(s.stage_id, static_cast<int>(specs.size()));
    specs.push_back(std::move(spec));
  }
  if (!specs.empty()) {
    supervisor_ = std::make_unique<WorkerSupervisor>();
    std::vector<std::string> names;
    for (const auto& spec : specs) names.push_back(spec.name);
    supervisor_->set_callbacks(
        [names](size_t i, int status) {
          log_warning(names[i], " ended with status ", status, "; restarting it");
        },
        [names](size_t i, const std::string& address) {
          log_warning(names[i], " is up again at ", address);
        },
        [names](size_t i, const std::string& why) {
          log_warning(names[i], " could not be restarted: ", why);
        });
    try {
      supervisor_->start_all(std::move(specs));
    } catch (const std::exception& e) {
      OMNI_THROW(e.what());
    }
  }

  std::vector<PipelineStage> stages;
  for (const auto& s : config.stages) {
    PipelineStage ps;
    ps.id = s.stage_id;
    ps.model_stage = s.engine.model_stage;
    ps.sources = s.engine_input_source;
    const int index = supervisor_index(s.stage_id);
    if (index >= 0) {
      ps.stage = std::make_shared<SupervisedStage>(*supervisor_, static_cast<size_t>(index),
                                                   stage_name(s), client, options_.init_timeout);
    } else {
      auto remote_client = client;
      remote_client.name = stage_name(s);
      std::string why;
      if (!rpc::wait_healthy(s.runtime.address, remote_client, options_.init_timeout, &why)) {
        OMNI_THROW(stage_name(s), " at ", s.runtime.address, " did not become healthy within ",
                   options_.init_timeout.count() / 1000.0, " s (", why, ")");
      }
      ps.stage = std::make_shared<rpc::RemoteStage>(s.runtime.address, remote_client);
    }
    stages_.push_back(ps.stage);
    stages.push_back(std::move(ps));
  }
  pipeline_ = std::make_unique<Pipeline>(std::move(stages));
  make_device_ledger();
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
    const auto info = Json::parse(m.stage->info_json());
    // What the stage holds on the device when loaded (with expert offload, less than all its
    // weights); a worker from before device_weight_bytes reports param_bytes only.
    m.bytes = info.value("device_weight_bytes", info.value("param_bytes", uint64_t{0}));
    const uint64_t budget = s.engine.gpu_memory_budget;
    if (budget > 0) {
      any_budget = true;
      auto& b = budgets[m.device];
      b = b == 0 ? budget : std::min(b, budget);
    }
    members.push_back(m);
  }
  if (!any_budget) return nullptr;
  return std::make_shared<DeviceLedger>(std::move(members), std::move(budgets));
}

void StageLauncher::make_device_ledger() {
  ledger_ = pipeline::make_device_ledger(options_.config, stages_);
  if (ledger_) pipeline_->set_device_ledger(ledger_);
}

StageLauncher::~StageLauncher() {
  pipeline_.reset();
  stages_.clear();
  if (supervisor_) supervisor_->stop_all();
}

bool StageLauncher::healthy(std::string* why) {
  rpc::ClientOptions client;
  client.token = options_.token;
  client.tls_ca_file = options_.tls_ca_file;
  for (const auto& s : options_.config.stages) {
    const int index = supervisor_index(s.stage_id);
    const std::string address =
        index >= 0 ? supervisor_->address(static_cast<size_t>(index)) : s.runtime.address;
    std::string reason;
    if (!rpc::wait_healthy(address, client, std::chrono::milliseconds(1000), &reason)) {
      if (why) *why = stage_name(s) + " at " + address + ": " + reason;
      return false;
    }
  }
  return true;
}

int StageLauncher::supervisor_index(int64_t stage_id) const {
  for (const auto& [id, index] : local_index_) {
    if (id == stage_id) return index;
  }
  return -1;
}

std::string StageLauncher::stats_json() { return pipeline_->stats_json(); }

}  // namespace omni::pipeline
