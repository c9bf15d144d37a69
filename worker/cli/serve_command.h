// `vllm-omni serve`: the OpenAI-compatible HTTP server (worker/http/chat_server.h) over a
// pipeline: the checkpoint's stages in this process (--model), or the stage workers of a stage
// config (--stage-configs-path). Serves until SIGTERM / SIGINT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "worker/config/stage_overrides.h"

namespace CLI {
class App;
}

namespace omni::cli {

struct ServeOptions {
  std::string model;               // checkpoint directory (in-process stages)
  std::string stage_configs_path;  // or: stage workers
  std::string stage_overrides;
  double stage_init_timeout_s = 600;
  std::string host = "127.0.0.1";
  int port = 8091;
  std::string api_key, api_key_file;
  std::string tls_cert, tls_key;  // PEM: serve HTTPS
  std::string served_model_name;  // default: the checkpoint folder's name
  size_t max_request_bytes = size_t{64} << 20;
  int max_concurrent_requests = 8;           // chat requests running at once
  int max_queued_requests = 32;              // waiting for a running place; more get 429
  double queue_timeout_s = 60;               // waiting longer gets 503
  uint64_t max_inflight_bytes = 0;           // bytes requests hold at once; 0: from the free memory
  int max_connections = 256;                 // open HTTP connections (more go to the overflow lane)
  int max_connections_per_client = 64;       // of them, from one client address
  double request_head_timeout_s = 10;        // the whole request head
  double request_body_timeout_s = 60;        // the whole body
  double keep_alive_timeout_s = 5;           // an idle connection between requests
  std::vector<std::string> allowed_hosts;    // Host names besides the loopback ones; "*": any
  std::vector<std::string> allowed_origins;  // CORS origins; "*": any
  bool metrics_public = false;               // /metrics without the key
  size_t max_media_items = 16;               // audio and image parts per request
  uint64_t max_image_pixels = uint64_t{1} << 25;  // all images of a request together
  std::string device = "auto";
  // /v1/videos (a diffusion model): jobs queued or running, seconds a finished one is kept,
  // MP4 bytes on disk for all of them, width x height x frames x steps of one (0: 4 times the
  // model's default request).
  size_t max_video_jobs = 16;
  double video_job_ttl_s = 3600;
  uint64_t max_video_bytes = uint64_t{1} << 30;
  double max_video_cost = 0;
  // /v1/images (an image model): requests waiting while one runs, and width x height x n one
  // may ask for (0: 4 times the model's default size).
  int max_queued_images = 16;
  double max_image_request_pixels = 0;
  // The engine option flags given (--cpu-offload-*, --dtype, ...): they apply to every stage,
  // the checkpoint's own (--model) or the YAML's, as on generate.
  config::EngineFlags engine;
};

void add_serve_options(CLI::App& app, ServeOptions& options);

// 0 after SIGTERM / SIGINT; 2 for a bad stage config or key file; 1 when the model cannot load
// or the port cannot be bound.
int run_serve(const ServeOptions& options, std::ostream& err);

}  // namespace omni::cli
