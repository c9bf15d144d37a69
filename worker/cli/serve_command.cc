#include "worker/cli/serve_command.h"

#include <c10/util/Exception.h>
#include <pthread.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <ostream>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/weights/hf_config.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"
#include "worker/config/stage_config.h"
#include "worker/config/stage_overrides.h"
#include "worker/http/chat_server.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/stage_launcher.h"
#include "worker/rpc/auth.h"

namespace omni::cli {

void add_serve_options(CLI::App& app, ServeOptions& o) {
  auto* model =
      app.add_option("--model", o.model, "checkpoint directory: its stages run in this process")
          ->type_name("DIR");
  auto* configs = app.add_option("--stage-configs-path", o.stage_configs_path,
                                 "serve the stage workers of this stage YAML instead")
                      ->type_name("FILE")
                      ->excludes(model);
  app.add_option("--stage-overrides", o.stage_overrides,
                 "with --stage-configs-path: per-stage settings as JSON")
      ->type_name("JSON")
      ->needs(configs);
  app.add_option("--stage-init-timeout", o.stage_init_timeout_s,
                 "with --stage-configs-path: seconds a stage worker may take to come up")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* key =
      app.add_option("--api-key", o.api_key, "clients must send 'Authorization: Bearer <key>'");
  app.add_option("--api-key-file", o.api_key_file, "the API key, read from a file")
      ->check(CLI::ExistingFile)
      ->excludes(key);
  auto* cert = app.add_option("--tls-cert", o.tls_cert, "PEM certificate: serve HTTPS")
                   ->type_name("FILE")
                   ->check(CLI::ExistingFile);
  auto* tls_key = app.add_option("--tls-key", o.tls_key, "PEM private key of --tls-cert")
                      ->type_name("FILE")
                      ->check(CLI::ExistingFile);
  cert->needs(tls_key);
  tls_key->needs(cert);
  app.add_option("--served-model-name", o.served_model_name,
                 "the model name requests use (default: the checkpoint folder's name)");
  app.add_option("--max-request-bytes", o.max_request_bytes, "larger request bodies get 413")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-concurrent-requests", o.max_concurrent_requests,
                 "requests running at once; more get 429")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--device", o.device, "with --model: cpu (the simulated device) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "with --model: compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  app.parse_complete_callback([model, configs] {
    if (model->count() == 0 && configs->count() == 0) {
      throw CLI::RequiredError("--model or --stage-configs-path");
    }
  });
}

namespace {

// The checkpoint's stages in this process: the thinker, and the talker and code2wav when the
// checkpoint speaks.
std::vector<pipeline::PipelineStage> local_pipeline(const ServeOptions& o) {
  const bool speech = models::qwen3_omni::has_speech_output(models::HfConfig::load(o.model));
  std::vector<pipeline::PipelineStage> stages;
  const auto add = [&](int64_t id, const char* model_stage, std::vector<int64_t> sources) {
    pipeline::LocalStageOptions s;
    s.name = "stage " + std::to_string(id) + " (" + model_stage + ")";
    s.model_stage = model_stage;
    s.model_dir = o.model;
    s.dtype = parse_dtype(o.dtype);
    s.device = offload::parse_device_kind(o.device);
    stages.push_back({id, model_stage, std::move(sources), pipeline::make_local_stage(s)});
  };
  add(0, "thinker", {});
  if (speech) {
    add(1, "talker", {0});
    add(2, "code2wav", {1});
  }
  return stages;
}

std::string folder_name(const std::string& path) {
  auto p = std::filesystem::path(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

int run_serve(const ServeOptions& o, std::ostream& err) {
  // SIGTERM / SIGINT are taken by sigwait below: blocked before any thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  http::ServerOptions server;
  server.host = o.host;
  server.port = o.port;
  server.max_request_bytes = o.max_request_bytes;
  server.max_concurrent_requests = o.max_concurrent_requests;
  server.tls_cert = o.tls_cert;
  server.tls_key = o.tls_key;
  std::unique_ptr<pipeline::StageLauncher> launcher;
  std::unique_ptr<pipeline::Pipeline> local;
  try {
    server.api_key = o.api_key_file.empty() ? o.api_key : rpc::read_token_file(o.api_key_file);
    if (!o.stage_configs_path.empty()) {
      pipeline::LauncherOptions lo;
      lo.config = config::load_pipeline_config(o.stage_configs_path);
      config::apply_stage_flags(lo.config, {}, o.stage_overrides);
      char self[4096];
      const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
      lo.worker_executable = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
      lo.init_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(o.stage_init_timeout_s * 1000));
      std::string thinker_model;
      for (const auto& s : lo.config.stages) {
        if (s.engine.model_stage == "thinker") thinker_model = s.engine.model;
      }
      server.model_name =
          o.served_model_name.empty() ? folder_name(thinker_model) : o.served_model_name;
      launcher = std::make_unique<pipeline::StageLauncher>(std::move(lo));
      auto* l = launcher.get();
      server.healthy = [l](std::string* why) { return l->healthy(why); };
    } else {
      server.model_name = o.served_model_name.empty() ? folder_name(o.model) : o.served_model_name;
      local = std::make_unique<pipeline::Pipeline>(local_pipeline(o));
    }
  } catch (const config::ConfigError& e) {
    err << "vllm-omni serve: error: " << one_line(e.what()) << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    err << "vllm-omni serve: error: " << one_line(e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    err << "vllm-omni serve: error: " << one_line(e.what()) << std::endl;
    return 1;
  }
  pipeline::Pipeline& pipeline = launcher ? launcher->pipeline() : *local;
  try {
    http::ChatServer chat(pipeline, server);
    chat.start();
    // Always printed (also when stderr is not a terminal): scripts read the port from it.
    err << "vllm-omni serve: listening on " << (o.tls_cert.empty() ? "http" : "https") << "://"
        << o.host << ":" << chat.port() << " (model '" << server.model_name << "')" << std::endl;
    int sig = 0;
    sigwait(&signals, &sig);
    log_info("signal ", sig, ": stopping");
    chat.stop();
  } catch (const std::exception& e) {
    err << "vllm-omni serve: error: " << one_line(e.what()) << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace omni::cli
