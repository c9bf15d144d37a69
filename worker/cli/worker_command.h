// `vllm-omni worker`: one stage of a stage config, served over gRPC. Builds the stage's runner
// (only its part of the checkpoint), loads the weights, applies the stage's offload settings
// after load, listens, and serves until SIGTERM / SIGINT (then drains: running requests get
// --drain-timeout seconds to finish). Loopback by default; any other address needs TLS or a
// token. The token comes from --auth-token-file or, without it, from $OMNI_WORKER_TOKEN (how a
// launcher hands the workers it starts theirs). With --ready-fd (the orchestrator's start-up
// protocol, worker/process/worker_process.h) it writes "LISTENING host:port" there once it serves.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "worker/config/engine_options.h"

namespace CLI {
class App;
}

namespace omni::cli {

struct WorkerOptions {
  std::string stage_configs_path;
  int64_t stage_id = -1;
  std::string listen = "127.0.0.1:0";
  std::string stage_overrides;  // JSON, as for generate
  std::string tls_cert, tls_key;
  std::string auth_token_file;
  uint64_t max_upstream_bytes = 0;  // 0: rpc::kDefaultMaxUpstreamBytes
  int ready_fd = -1;
  double drain_timeout_s = 10;
  // Instead of runtime.devices: cpu (the simulated device) or cuda.
  std::string device;
  config::EngineFlags engine;  // the engine option flags given, applied to the stage
};

void add_worker_options(CLI::App& app, WorkerOptions& options);

// 0 after a clean shutdown; 2 for a bad stage config (the message names file:line:col); 1 for
// a failure to load or to listen.
int run_worker(const WorkerOptions& options, std::ostream& err);

}  // namespace omni::cli
