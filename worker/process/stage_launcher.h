// A pipeline of stage workers from a stage config: each stage either connects to the worker
// at runtime.address (already running, maybe on another host) or is started here as a local
// `vllm-omni worker` process on a loopback port. Waits until every worker is healthy (naming the
// one that is not within the start-up timeout), restarts a worker that dies (its in-flight
// requests fail naming the stage; later requests wait for the restart and succeed), and stops
// every worker it started when destroyed.
//
// Every launch makes a fresh random token for the workers it starts (even on loopback, where any
// local process could otherwise call them) and hands it to them in their environment
// (rpc::kWorkerTokenEnv), never on their command line; a restarted worker gets the same one.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/pipeline.h"
#include "worker/process/worker_process.h"
#include "worker/rpc/stage_client.h"

namespace omni::pipeline {

struct LauncherOptions {
  // The config after the command line's flags and overrides (config::apply_stage_flags).
  config::PipelineConfig config;
  // The vllm-omni executable the local workers run (`<exe> worker ...`).
  std::string worker_executable;
  std::chrono::milliseconds init_timeout{600000};
  // For workers at runtime.address: their shared token and the CA that signed their
  // certificates (empty: no TLS). Local workers never get this token but one of their own.
  std::string token;
  std::string tls_ca_file;
  // Local workers' output goes to <log_dir>/stage-<id>.log; empty: this process's stderr.
  std::string log_dir;
};

class StageLauncher {
 public:
  // Starts (or connects to) every stage. Throws omni::Error naming the stage that did not come
  // up (and why: its exit status and last log lines, or the health check's last answer).
  explicit StageLauncher(LauncherOptions options);
  ~StageLauncher();  // stops the local workers

  Pipeline& pipeline() { return *pipeline_; }
  // {"<stage name>": {"server": ..., "stage": <offload stats>}, ..., "device_ledger": {...}}
  // (the ledger only when a device budget is set).
  std::string stats_json();
  // Every stage answers its health check (within a second each); `why` names the first that
  // does not.
  bool healthy(std::string* why = nullptr);
  // The local workers' supervisor (tests kill workers through it); null without local workers.
  WorkerSupervisor* supervisor() { return supervisor_.get(); }
  // Index of stage `id` in the supervisor, or -1 for a remote one.
  int supervisor_index(int64_t stage_id) const;

 private:
  LauncherOptions options_;
  std::string local_token_;  // the local workers' token, made for this launch
  std::unique_ptr<WorkerSupervisor> supervisor_;
  std::vector<std::pair<int64_t, int>> local_index_;  // stage id -> supervisor index
  std::vector<std::shared_ptr<Stage>> stages_;
  std::unique_ptr<Pipeline> pipeline_;
  std::shared_ptr<DeviceLedger> ledger_;
  void make_device_ledger();
};

// The stage's settings as a --stage-overrides object for `vllm-omni worker` (every engine key
// that differs from the YAML default), so that a local worker runs exactly the resolved config.
std::string resolved_stage_overrides(const config::StageConfig& stage);

}  // namespace omni::pipeline
