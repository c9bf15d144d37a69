#include "worker/cli/generate_backend.h"

// `vllm-omni generate --stage-configs-path F`: the request goes through the stage workers of
// the config (worker/process/stage_launcher.h).
#include <chrono>

#include "worker/cli/process_control.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"
#include "worker/process/stage_launcher.h"
#include "worker/process/worker_process.h"
#include "worker/rpc/auth.h"

namespace omni::cli {

std::unique_ptr<GenerateBackend> make_pipeline_backend(const GenerateOptions& o) {
  pipeline::LauncherOptions options;
  try {
    options.config = config::load_pipeline_config(o.stage_configs_path);
    config::apply_stage_flags(options.config, o.engine, o.stage_overrides);
  } catch (const config::ConfigError& e) {
    throw BadInput(e.what());
  }
  options.worker_executable = self_executable();
  if (!o.auth_token_file.empty()) options.token = rpc::read_token_file(o.auth_token_file);
  options.tls_ca_file = o.tls_ca_file;
  options.init_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o.stage_init_timeout_s * 1000));
  // Ctrl-C / SIGTERM stop the workers this process starts.
  pipeline::install_shutdown_handler();
  const config::PipelineConfig config = options.config;
  auto launcher = std::make_shared<pipeline::StageLauncher>(std::move(options));
  pipeline::Pipeline& p = launcher->pipeline();
  return make_backend(o, config, std::move(launcher), p);
}

}  // namespace omni::cli
