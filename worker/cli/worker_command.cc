#include "worker/cli/worker_command.h"

#include <c10/util/Exception.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ostream>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "worker/cli/engine_flags.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"
#include "worker/cli/process_control.h"
#include "worker/cli/validators.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"
#include "worker/pipeline/local_stages.h"
#include "worker/process/stage_launcher.h"
#include "worker/rpc/auth.h"
#include "worker/rpc/stage_server.h"

namespace omni::cli {

void add_worker_options(CLI::App& app, WorkerOptions& o) {
  app.add_option("--stage-configs-path", o.stage_configs_path, "the stage YAML")
      ->required()
      ->type_name("FILE");
  app.add_option("--stage-id", o.stage_id, "the stage this worker serves")
      ->required()
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--listen", o.listen,
                 "host:port to serve on (port 0: any free port); beyond loopback it needs "
                 "--tls-cert/--tls-key or a token (--auth-token-file or $OMNI_WORKER_TOKEN)")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  app.add_option("--stage-overrides", o.stage_overrides,
                 "per-stage settings as JSON, e.g. '{\"1\": {\"cpu_offload_enabled\": true}}'")
      ->type_name("JSON");
  auto* cert = app.add_option("--tls-cert", o.tls_cert, "PEM certificate: serve over TLS")
                   ->type_name("FILE")
                   ->check(CLI::ExistingFile);
  auto* key = app.add_option("--tls-key", o.tls_key, "PEM private key of --tls-cert")
                  ->type_name("FILE")
                  ->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
  app.add_option("--auth-token-file", o.auth_token_file,
                 std::string("a file holding the token every request must carry (Bearer); "
                             "without it, the token in $") +
                     rpc::kWorkerTokenEnv +
                     " (generate and serve hand the workers they start one there)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  app.add_option("--max-upstream-bytes", o.max_upstream_bytes,
                 "the memory one request's upstream packets may take here, together (the talker "
                 "keeps all its thinker's rows); beyond it the request fails. One packet may "
                 "take 2GiB at most")
      ->type_name("BYTES")
      ->transform(positive_byte_size())
      ->default_str(std::to_string(rpc::kDefaultMaxUpstreamBytes >> 30) + "GiB");
  app.add_option("--ready-fd", o.ready_fd,
                 "write 'LISTENING host:port' to this file descriptor once serving (used by the "
                 "orchestrator)")
      ->type_name("FD")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--drain-timeout", o.drain_timeout_s,
                 "seconds running requests get to finish after SIGTERM")
      ->type_name("SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_engine_flags(app, o.engine);
  app.add_option("--device", o.device, "instead of runtime.devices: auto, cpu or cuda")
      ->type_name("auto|cpu|cuda")
      ->check(one_of(offload::names::device_kinds()));
}

int run_worker(const WorkerOptions& o, std::ostream& err) {
  StopSignals stop;  // before any thread exists

  config::StageConfig stage;
  try {
    auto cfg = config::load_pipeline_config(o.stage_configs_path);
    config::apply_stage_flags(cfg, o.engine, o.stage_overrides);
    stage = cfg.stage(o.stage_id);
  } catch (...) {
    return report_command_error(std::current_exception(), "vllm-omni worker", err);
  }
  const std::string name = pipeline::stage_name(stage);
  try {
    rpc::ServerOptions server_options;
    server_options.listen_address = o.listen;
    server_options.tls_cert_file = o.tls_cert;
    server_options.tls_key_file = o.tls_key;
    const char* env_token = std::getenv(rpc::kWorkerTokenEnv);
    if (env_token != nullptr && *env_token != '\0' && !o.auth_token_file.empty()) {
      err << "vllm-omni worker: error: a token both in --auth-token-file and in $"
          << rpc::kWorkerTokenEnv << ": give one" << std::endl;
      return 2;
    }
    server_options.token = !o.auth_token_file.empty() ? rpc::read_token_file(o.auth_token_file)
                           : env_token != nullptr     ? env_token
                                                      : "";
    if (o.max_upstream_bytes > 0) server_options.max_upstream_bytes = o.max_upstream_bytes;
    // Refuse an open, unauthenticated listen address before spending minutes on the weights.
    if (!rpc::is_loopback_address(o.listen) && o.tls_cert.empty() && server_options.token.empty()) {
      err << "vllm-omni worker: error: --listen " << o.listen
          << " is not a loopback address: give --tls-cert/--tls-key or a token "
          << "(--auth-token-file or $" << rpc::kWorkerTokenEnv << ")" << std::endl;
      return 2;
    }
    log_info(name, ": loading ", stage.engine.model);
    pipeline::warn_ignored_engine_keys(stage);
    auto local = pipeline::make_local_stage(pipeline::local_stage_options(stage, o.device));
    rpc::StageServer server(*local, stage.stage_id, stage.engine.model_stage, server_options);
    server.start();
    log_info(name, ": serving on ", server.address());
    if (o.ready_fd >= 0) {
      const std::string line = "LISTENING " + server.address() + "\n";
      const ssize_t n = ::write(o.ready_fd, line.data(), line.size());
      ::close(o.ready_fd);
      OMNI_CHECK(n == static_cast<ssize_t>(line.size()), "cannot write to --ready-fd ", o.ready_fd);
    }
    const int sig = stop.wait();
    log_info(name, ": signal ", sig, ", draining");
    server.shutdown(std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000)));
    server.wait();
    return 0;
  } catch (...) {
    return report_command_error(std::current_exception(), "vllm-omni worker: " + name, err);
  }
}

}  // namespace omni::cli
