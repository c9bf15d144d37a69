// A stage worker's gRPC server: serves one pipeline::Stage (a LocalStage in the worker process)
// as the StageService of proto/stage.proto, plus the standard health service.
//
// Each Run call is a thread (the synchronous gRPC API) that calls stage.run while a second
// thread reads the orchestrator's upstream packets into the stage's input queue, so the stage
// starts before its upstream has finished. Errors of the stage travel in-band (RunResponse.error,
// status OK): the client gets the stage's own code and message, not a transport status.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/pipeline/stage.h"

namespace omni::rpc {

// What one Run call's upstream packets may hold in the worker's memory, together: the talker
// keeps all of its thinker's rows, 2 x 2048 values per token (Qwen3-Omni 30B-A3B: 1 GiB for a
// 64k-token context in float32, half that in bfloat16); 4 GiB is 4x that.
constexpr uint64_t kDefaultMaxUpstreamBytes = uint64_t{4} << 30;

struct ServerOptions {
  // host:port; port 0 = the OS picks one (address() tells which after start()).
  std::string listen_address = "127.0.0.1:0";
  std::string token;  // callers must send it (auth.h); empty = no token
  // PEM files; both empty = no TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Listening beyond loopback without TLS or a token lets anyone on the network run requests:
  // refused unless this is set.
  bool allow_insecure_nonloopback = false;
  // Beyond it a request fails with StageError kInvalidArgument (wire.h counts the bytes).
  uint64_t max_upstream_bytes = kDefaultMaxUpstreamBytes;
};

class StageServer {
 public:
  // `stage_id` and `model_stage` (thinker | talker | code2wav) are what the Info RPC reports.
  // Throws std::invalid_argument for a non-loopback listen address without TLS or token (unless
  // allowed) and for a TLS certificate without its key.
  StageServer(pipeline::Stage& stage, int64_t stage_id, std::string model_stage,
              ServerOptions options = {});
  // Shuts down at once (grace 0) if still serving.
  ~StageServer();
  StageServer(const StageServer&) = delete;
  StageServer& operator=(const StageServer&) = delete;

  // Binds and serves; health is SERVING when this returns. Throws std::runtime_error naming
  // the address when it cannot listen, or naming the file when a TLS file is unreadable.
  void start();
  // "host:port" with the bound port (the listen address until start()).
  std::string address() const;
  int port() const;

  // Graceful drain: health goes NOT_SERVING and new Run calls get StageError kUnavailable at
  // once; running requests get up to `grace` to finish, then are cancelled (their clients get
  // kUnavailable); then the server stops. Safe to call more than once and from any thread.
  void shutdown(std::chrono::milliseconds grace);
  // Blocks until shutdown() has stopped the server (a worker's main thread waits here).
  void wait();

  // The server's own counters as JSON: {"requests_started": n, ..., "in_flight": n}. The Stats
  // RPC returns {"server": <this>, "stage": <stage.stats_json()>}.
  std::string counters_json() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace omni::rpc
