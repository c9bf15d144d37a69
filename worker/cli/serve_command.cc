#include "worker/cli/serve_command.h"

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <ostream>
#include <set>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "model_runner/runner/expert_offload.h"
#include "model_runner/weights/hf_config.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"
#include "worker/cli/process_control.h"
#include "worker/cli/sampling_defaults.h"
#include "worker/cli/validators.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"
#include "worker/http/chat_server.h"
#include "worker/pipeline/local_pipeline.h"
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
                 "per-stage settings as JSON, e.g. '{\"1\": {\"cpu_offload_enabled\": true}}' "
                 "(with --model the stages are 0 thinker, 1 talker, 2 code2wav)")
      ->type_name("JSON");
  // The global offload flags: only those given change the stages' settings.
  auto& f = o.flags;
  app.add_flag_callback(
      "--cpu-offload-enabled", [&f] { f.cpu_offload_enabled = true; },
      "component offload inside every stage");
  app.add_option_function<std::vector<std::string>>(
         "--cpu-offload-components",
         [&f](const std::vector<std::string>& v) { f.cpu_offload_components = v; },
         "thinker, talker, code2wav select stages that give their weights back; other names "
         "(visual, audio_tower, code_predictor, globs) modules inside every stage")
      ->type_name("NAMES")
      ->delimiter(',');
  app.add_option_function<std::string>(
         "--cpu-offload-strategy", [&f](const std::string& v) { f.cpu_offload_strategy = v; },
         "alternating or sequential")
      ->check(one_of(offload::names::component_policies()));
  app.add_flag_callback(
      "--cpu-offload-pin-memory", [&f] { f.cpu_offload_pin_memory = true; },
      "pinned host memory for offloaded weights (the default)");
  app.add_flag_callback(
      "--no-cpu-offload-pin-memory", [&f] { f.cpu_offload_pin_memory = false; },
      "pageable host memory for offloaded weights");
  app.add_flag_callback(
      "--enable-cpu-offload", [&f] { f.enable_cpu_offload = true; },
      "every stage gives its weights back when another needs the room");
  app.add_flag_callback(
      "--enable-layerwise-offload", [&f] { f.enable_layerwise_offload = true; },
      "stream the decoder layers of the thinker and the talker");
  app.add_option_function<int64_t>(
         "--layerwise-num-gpu-layers", [&f](const int64_t& n) { f.layerwise_num_gpu_layers = n; },
         "layerwise: layers copied ahead")
      ->check(CLI::PositiveNumber);
  app.add_option_function<std::string>(
         "--gpu-memory-budget",
         [&f](const std::string& v) { f.gpu_memory_budget = config::parse_byte_size(v); },
         "one device budget shared by the stages on a device (20GiB, 8GB, bytes)")
      ->type_name("BYTES")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              config::parse_byte_size(text);
              return "";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          ""));

  app.add_flag_callback(
      "--cpu-offload-experts", [&f] { f.cpu_offload_experts = true; },
      "expert-level MoE offload of the thinker's experts (a device expert cache)");
  app.add_option_function<std::string>(
         "--expert-cache-budget", [&f](const std::string& v) { f.expert_cache_budget = v; },
         "device bytes of the expert cache: a percentage of all experts' bytes (25%) or bytes "
         "(768MiB)")
      ->type_name("PERCENT|BYTES")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              size_t bytes = 0;
              double fraction = 0;
              models::parse_expert_cache_budget(text, "--expert-cache-budget", &bytes, &fraction);
              return "";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          ""));
  app.add_flag_callback(
      "--no-expert-prefetch", [&f] { f.expert_prefetch = false; },
      "experts: do not predict and prefetch the next MoE layer's experts");
  app.add_option_function<std::string>(
         "--expert-miss-policy", [&f](const std::string& v) { f.expert_miss_policy = v; },
         "experts: what a miss does: fetch it, compute it on the host, or auto")
      ->check(one_of(offload::names::expert_miss_policies()));
  app.add_option_function<std::string>(
         "--expert-eviction", [&f](const std::string& v) { f.expert_eviction = v; },
         "experts: which expert leaves a full cache: by the layers' run order, or lru")
      ->check(one_of(offload::names::expert_evictions()));
  app.add_option_function<std::string>(
         "--host-memory-budget",
         [&f](const std::string& v) { f.host_memory_budget = config::parse_byte_size(v); },
         "host bytes for the streamed weights (layerwise layers, experts); beyond it they are "
         "read from the checkpoint's files when needed (20GiB, bytes; 0 = no limit)")
      ->type_name("BYTES")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              config::parse_byte_size(text);
              return "";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          ""));
  app.add_option_function<std::string>(
         "--disk-read", [&f](const std::string& v) { f.disk_read = v; },
         "how weights beyond --host-memory-budget are read: our pinned cache, or the page cache")
      ->check(one_of(offload::names::disk_reads()));

  app.add_option("--stage-init-timeout", o.stage_init_timeout_s,
                 "with --stage-configs-path: seconds a stage worker may take to come up")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* key = app.add_option("--api-key", o.api_key,
                             "clients must send 'Authorization: Bearer <key>' (without it and "
                             "--api-key-file: the VLLM_API_KEY environment variable, if set)");
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
  app.add_option("--max-connections", o.max_connections,
                 "open connections; more are answered 503 and closed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--request-head-timeout", o.request_head_timeout_s,
                 "seconds a client may take to send a request's whole head (then closed)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--request-body-timeout", o.request_body_timeout_s,
                 "seconds a client may take to send a request's whole body")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-alive-timeout", o.keep_alive_timeout_s,
                 "seconds an idle connection is kept open for its next request")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--allowed-hosts", o.allowed_hosts,
                 "Host names the server answers to besides localhost, 127.0.0.1 and [::1] "
                 "(\"*\": any); without it a server with no key on a loopback address answers "
                 "those names only, against DNS rebinding")
      ->type_name("NAME")
      ->delimiter(',');
  app.add_option("--allowed-origins", o.allowed_origins,
                 "browser origins (https://app.example:8443) whose pages may read the answers "
                 "(CORS; \"*\": any); without it the server sends no CORS headers")
      ->type_name("ORIGIN")
      ->delimiter(',');
  app.add_flag("--metrics-public", o.metrics_public, "serve /metrics without the API key");
  app.add_option("--max-media-items", o.max_media_items,
                 "audio and image parts a request may hold; more get 400")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-image-pixels", o.max_image_pixels,
                 "pixels all images of a request may hold together, read from their headers "
                 "before decoding; more get 400")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "with --model: auto (cuda when a CUDA device is usable), cpu (the simulated "
                 "device) or cuda")
      ->check(one_of(offload::names::device_kinds()))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "with --model: compute dtype (auto: the checkpoint's)")
      ->check(one_of({"auto", "float32", "bfloat16", "float16"}))
      ->capture_default_str();
  app.parse_complete_callback([model, configs] {
    if (model->count() == 0 && configs->count() == 0) {
      throw CLI::RequiredError("--model or --stage-configs-path");
    }
  });
}

namespace {

std::string folder_name(const std::string& path) {
  auto p = std::filesystem::path(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// The stages' default_sampling_params (YAML or --stage-overrides) for what a request leaves
// unset, as `generate` applies them.
std::function<void(models::OmniRequest&, const std::set<std::string>&)> yaml_sampling(
    const config::PipelineConfig& config) {
  return [config](models::OmniRequest& request, const std::set<std::string>& given) {
    apply_sampling_defaults(request, config, given);
  };
}

}  // namespace

int run_serve(const ServeOptions& o, std::ostream& err) {
  StopSignals stop;  // before any thread exists

  http::ServerOptions server;
  server.host = o.host;
  server.port = o.port;
  server.max_request_bytes = o.max_request_bytes;
  server.max_concurrent_requests = o.max_concurrent_requests;
  server.tls_cert = o.tls_cert;
  server.tls_key = o.tls_key;
  server.allowed_hosts = o.allowed_hosts;
  server.allowed_origins = o.allowed_origins;
  server.metrics_public = o.metrics_public;
  server.limits.max_media_items = o.max_media_items;
  server.limits.max_image_pixels = o.max_image_pixels;
  const auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  };
  server.connections.max_connections = o.max_connections;
  server.connections.head_timeout = ms(o.request_head_timeout_s);
  server.connections.body_timeout = ms(o.request_body_timeout_s);
  server.connections.idle_timeout = ms(o.keep_alive_timeout_s);
  std::unique_ptr<pipeline::StageLauncher> launcher;
  std::unique_ptr<pipeline::Pipeline> local;
  try {
    // A key in the environment stays out of the process list, as a key file does.
    const char* env_key = std::getenv("VLLM_API_KEY");
    server.api_key = !o.api_key_file.empty() ? rpc::read_token_file(o.api_key_file)
                     : !o.api_key.empty()    ? o.api_key
                     : env_key != nullptr    ? env_key
                                             : "";
    if (!o.stage_configs_path.empty()) {
      pipeline::LauncherOptions lo;
      lo.config = config::load_pipeline_config(o.stage_configs_path);
      config::apply_stage_flags(lo.config, o.flags, o.stage_overrides);
      lo.worker_executable = self_executable();
      lo.init_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(o.stage_init_timeout_s * 1000));
      std::string thinker_model;
      for (const auto& s : lo.config.stages) {
        if (s.engine.model_stage == "thinker") thinker_model = s.engine.model;
      }
      server.model_name =
          o.served_model_name.empty() ? folder_name(thinker_model) : o.served_model_name;
      server.sampling_defaults = yaml_sampling(lo.config);
      launcher = std::make_unique<pipeline::StageLauncher>(std::move(lo));
      auto* l = launcher.get();
      server.healthy = [l](std::string* why) { return l->healthy(why); };
    } else {
      server.model_name = o.served_model_name.empty() ? folder_name(o.model) : o.served_model_name;
      const std::string device = resolved_device(o.device);
      auto cfg = pipeline::checkpoint_stage_config(o.model, device, o.dtype);
      config::apply_stage_flags(cfg, o.flags, o.stage_overrides);
      server.sampling_defaults = yaml_sampling(cfg);
      local = pipeline::make_local_pipeline(cfg, device);
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
    const int sig = stop.wait();
    log_info("signal ", sig, ": stopping");
    chat.stop();
  } catch (const std::exception& e) {
    err << "vllm-omni serve: error: " << one_line(e.what()) << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace omni::cli
