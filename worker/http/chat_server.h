// The OpenAI-compatible HTTP front end of a pipeline (`vllm-omni serve`): translates HTTP
// requests into Pipeline requests and the pipeline's results and streamed pieces back into
// OpenAI JSON and server-sent events. It knows nothing of stages, gRPC or models beyond the
// Pipeline interface; the OpenAI JSON never reaches the pipeline (worker/http/openai_protocol.h
// parses and builds it).
//
// Routes: POST /v1/chat/completions (JSON, or SSE with "stream": true), GET /v1/models,
// /v1/videos (video_api.h), /v1/images (image_api.h), GET /health (200 only when every stage is
// healthy), GET /metrics (Prometheus text; behind the key unless metrics_public). Requests are
// first checked by their head (request_guard.h: framing, key, body size, byte budget) before a byte
// of the body is read; chat requests then wait for a running place in a bounded queue
// (admission_queue.h). The bytes requests hold count against one budget (inflight_budget.h). Every
// error is OpenAI's error JSON; no request can take the server down.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/http/connection_limits.h"
#include "worker/http/image_api.h"
#include "worker/http/openai_protocol.h"
#include "worker/http/video_api.h"
#include "worker/pipeline/pipeline.h"

namespace omni::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8091;         // 0: any free port (port() tells which)
  std::string api_key;     // empty: no key needed
  std::string model_name;  // what requests must name in "model" (and /v1/models lists)
  size_t max_request_bytes = size_t{64} << 20;
  int max_concurrent_requests = 8;  // chat requests running at once; more wait in the queue
  int max_queued_requests = 32;     // chat requests waiting; more get 429
  std::chrono::milliseconds queue_timeout{60000};  // a request waiting longer gets 503
  // Bytes requests may hold at once (bodies, parsed JSON, media, answers); 0: a quarter of the
  // memory available when the server starts (default_inflight_bytes).
  uint64_t max_inflight_bytes = 0;
  // PEM files: serve HTTPS (both or neither).
  std::string tls_cert, tls_key;
  // Host names answered besides the loopback ones ("*": any); see request_guard.h.
  std::vector<std::string> allowed_hosts;
  // Browser origins whose pages may read the answers (CORS; "*": any). Empty: no CORS headers.
  std::vector<std::string> allowed_origins;
  // /metrics without the key.
  bool metrics_public = false;
  // What one connection may hold: deadlines for the request head and body, idle keep-alive
  // time, open connections.
  ConnectionLimits connections;
  // Per-request limits of the body's messages and media (media items, bytes, image pixels).
  ParseLimits limits;
  // Puts the stages' default_sampling_params in a request (its own values, Request::sampling,
  // win over them).
  std::function<void(pipeline::Request&)> sampling_defaults;
  // Health of the stages: true when every stage answers (why: what is wrong otherwise).
  std::function<bool(std::string* why)> healthy;
  // /v1/videos jobs (a pipeline with a diffusion stage; video_api.h).
  VideoOptions videos;
  // /v1/images requests (a pipeline with an image stage; image_api.h).
  ImageOptions images;
};

class ChatServer {
 public:
  ChatServer(pipeline::Pipeline& pipeline, ServerOptions options);
  ~ChatServer();  // stop()

  // Binds (throws std::runtime_error naming host:port when it cannot) and serves on a thread
  // of its own.
  void start();
  int port() const;
  // Stops accepting, lets running handlers end (streams are cancelled), joins.
  void stop();
  // Blocks until stop().
  void wait();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace omni::http
