#include "worker/process/stage_launcher.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "worker/config/engine_options.h"
#include "worker/rpc/auth.h"

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
  StageInfo info() override { return current()->info(); }
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

std::string resolved_stage_overrides(const config::StageConfig& s) {
  Json engine = config::engine_args_json(s.engine);
  engine["runtime"] =
      Json{{"devices", s.runtime.devices}, {"max_batch_size", s.runtime.max_batch_size}};
  return Json{{std::to_string(s.stage_id), engine}}.dump();
}

StageLauncher::StageLauncher(LauncherOptions options) : options_(std::move(options)) {
  const auto& config = options_.config;
  // Local workers get their own token, not the configured one: it may be shared with other
  // hosts, and a leak there must not open the workers of every launch on this one.
  local_token_ = rpc::random_token();
  rpc::ClientOptions client;
  client.token = local_token_;
  rpc::ClientOptions remote_client;
  remote_client.token = options_.token;
  remote_client.tls_ca_file = options_.tls_ca_file;

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
    spec.env = {{rpc::kWorkerTokenEnv, local_token_}};
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
    ps.input_func = s.custom_process_input_func;
    const int index = supervisor_index(s.stage_id);
    if (index >= 0) {
      ps.stage = std::make_shared<SupervisedStage>(*supervisor_, static_cast<size_t>(index),
                                                   stage_name(s), client, options_.init_timeout);
    } else {
      auto named = remote_client;
      named.name = stage_name(s);
      std::string why;
      if (!rpc::wait_healthy(s.runtime.address, named, options_.init_timeout, &why)) {
        OMNI_THROW(stage_name(s), " at ", s.runtime.address, " did not become healthy within ",
                   options_.init_timeout.count() / 1000.0, " s (", why, ")");
      }
      ps.stage = std::make_shared<rpc::RemoteStage>(s.runtime.address, named);
    }
    stages_.push_back(ps.stage);
    stages.push_back(std::move(ps));
  }
  pipeline_ = std::make_unique<Pipeline>(std::move(stages));
  make_device_ledger();
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
  for (const auto& s : options_.config.stages) {
    const int index = supervisor_index(s.stage_id);
    const std::string address =
        index >= 0 ? supervisor_->address(static_cast<size_t>(index)) : s.runtime.address;
    rpc::ClientOptions client;
    client.token = index >= 0 ? local_token_ : options_.token;
    if (index < 0) client.tls_ca_file = options_.tls_ca_file;
    std::string reason;
    if (!rpc::wait_healthy(address, client, std::chrono::milliseconds(1000), &reason)) {
      if (why) {
        *why = stage_name(s);
        why->append(" at ").append(address).append(": ").append(reason);
      }
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
