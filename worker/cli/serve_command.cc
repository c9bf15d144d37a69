#include "worker/cli/serve_command.h"

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <ostream>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "model_runner/weights/hf_config.h"
#include "worker/cli/engine_flags.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"
#include "worker/cli/process_control.h"
#include "worker/cli/sampling_defaults.h"
#include "worker/cli/validators.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"
#include "worker/http/chat_server.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/model_family.h"
#include "worker/process/stage_launcher.h"
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
  add_engine_flags(app, o.engine);

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
                 "chat requests running at once; more wait in a queue")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queued-requests", o.max_queued_requests,
                 "chat requests waiting for a running place; more get 429 with Retry-After "
                 "(0: no queue)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--queue-timeout", o.queue_timeout_s,
                 "seconds a request may wait in the queue; then 503 with Retry-After")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-inflight-bytes", o.max_inflight_bytes,
                 "bytes all requests may hold at once (bodies, parsed JSON, media, answers, "
                 "video frames); more get 503 with Retry-After (default: a quarter of the "
                 "memory available once the model has loaded); a number or 512MiB, 4GiB")
      ->type_name("BYTES")
      ->transform(positive_byte_size());
  app.add_option("--max-connections", o.max_connections,
                 "open connections; more are answered from their head alone (/health and "
                 "/metrics; 503 for the rest)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connections-per-client", o.max_connections_per_client,
                 "open connections of one client address (behind a proxy, raise it to "
                 "--max-connections)")
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
  app.add_option("--max-video-jobs", o.max_video_jobs,
                 "video jobs (/v1/videos) queued or running at once; more get 429 (finished "
                 "ones count against --max-video-bytes and --video-job-ttl)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--video-job-ttl", o.video_job_ttl_s,
                 "seconds a finished video job and its MP4 are kept before they are removed")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-video-bytes", o.max_video_bytes,
                 "MP4 bytes all video jobs may hold on disk; a video that would not fit fails")
      ->type_name("BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-video-cost", o.max_video_cost,
                 "width x height x frames x steps one video job may ask for (default: 4 times "
                 "the model's default request); more get 400")
      ->type_name("COST")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-queued-images", o.max_queued_images,
                 "image requests (/v1/images/generations and /edits) waiting while one runs; "
                 "more get 429 with Retry-After (0: no queue)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-image-request-pixels", o.max_image_request_pixels,
                 "width x height x n one image request may ask for (default: 4 times the "
                 "model's default size); more get 400")
      ->type_name("PIXELS")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", o.device,
                 "with --model: auto (cuda when a CUDA device is usable), cpu (the simulated "
                 "device) or cuda (a stage YAML names its devices in runtime.devices)")
      ->check(one_of(offload::names::device_kinds()))
      ->excludes(configs)
      ->capture_default_str();
  app.parse_complete_callback([&app, model, configs] {
    if (model->count() == 0 && configs->count() == 0) {
      throw CLI::RequiredError("--model or --stage-configs-path");
    }
    if (configs->count() == 0) check_engine_flag_needs(app);
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
std::function<void(pipeline::Request&)> yaml_sampling(const config::PipelineConfig& config) {
  return [config](pipeline::Request& request) { apply_sampling_defaults(request, config, {}); };
}

// Video jobs that run at once: as many as the diffusion stages denoise together (the fewest).
size_t video_job_slots(const config::PipelineConfig& config) {
  int64_t slots = 0;
  for (const auto& s : config.stages) {
    if (s.stage_type != "diffusion") continue;
    slots = slots == 0 ? s.max_num_seqs() : std::min(slots, s.max_num_seqs());
  }
  return static_cast<size_t>(std::max<int64_t>(1, slots));
}

}  // namespace

int run_serve(const ServeOptions& o, std::ostream& err) {
  StopSignals stop;  // before any thread exists

  http::ServerOptions server;
  server.host = o.host;
  server.port = o.port;
  server.max_request_bytes = o.max_request_bytes;
  server.max_concurrent_requests = o.max_concurrent_requests;
  server.max_queued_requests = o.max_queued_requests;
  server.max_inflight_bytes = o.max_inflight_bytes;
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
  server.queue_timeout = ms(o.queue_timeout_s);
  server.connections.max_connections = o.max_connections;
  server.connections.max_connections_per_client =
      std::min(o.max_connections_per_client, o.max_connections);
  server.connections.head_timeout = ms(o.request_head_timeout_s);
  server.connections.body_timeout = ms(o.request_body_timeout_s);
  server.connections.idle_timeout = ms(o.keep_alive_timeout_s);
  server.videos.max_jobs = o.max_video_jobs;
  server.videos.max_bytes = o.max_video_bytes;
  server.videos.max_cost = o.max_video_cost;
  server.images.max_queued = o.max_queued_images;
  server.images.max_pixels = o.max_image_request_pixels;
  server.videos.ttl = std::chrono::seconds(
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(o.video_job_ttl_s))));
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
      config::apply_stage_flags(lo.config, o.engine, o.stage_overrides);
      lo.worker_executable = self_executable();
      lo.init_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(o.stage_init_timeout_s * 1000));
      // Named after the checkpoint of the first stage that reads the request.
      const auto entry = lo.config.entry_stages();
      const std::string entry_model =
          entry.empty() ? "" : lo.config.stage(entry.front()).engine.model;
      server.model_name =
          o.served_model_name.empty() ? folder_name(entry_model) : o.served_model_name;
      server.sampling_defaults = yaml_sampling(lo.config);
      server.videos.concurrent_jobs = video_job_slots(lo.config);
      launcher = std::make_unique<pipeline::StageLauncher>(std::move(lo));
      auto* l = launcher.get();
      server.healthy = [l](std::string* why) { return l->healthy(why); };
    } else {
      server.model_name = o.served_model_name.empty() ? folder_name(o.model) : o.served_model_name;
      const std::string device = resolved_device(o.device);
      auto cfg = pipeline::checkpoint_stage_config(o.model, device, "auto");
      config::apply_stage_flags(cfg, o.engine, o.stage_overrides);
      server.sampling_defaults = yaml_sampling(cfg);
      server.videos.concurrent_jobs = video_job_slots(cfg);
      // The frame rate turns a video request's `seconds` into frames; a request's unset fields
      // take the pipeline's defaults (its cost cap is from them).
      const auto& family = pipeline::family_of_checkpoint(o.model);
      if (const auto video = family.video_defaults(o.model)) {
        server.videos.fps = video->fps;
        server.videos.default_width = video->width;
        server.videos.default_height = video->height;
        server.videos.default_frames = video->frames;
        server.videos.default_steps = video->steps;
      }
      if (const auto image = family.image_defaults(o.model)) {
        server.images.default_width = image->width;
        server.images.default_height = image->height;
        server.images.max_input_images = image->max_input_images;
      }
      local = pipeline::make_local_pipeline(cfg, device);
    }
  } catch (...) {
    return report_command_error(std::current_exception(), "vllm-omni serve", err);
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
  } catch (...) {
    return report_command_error(std::current_exception(), "vllm-omni serve", err);
  }
  return 0;
}

}  // namespace omni::cli
