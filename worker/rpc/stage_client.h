// The orchestrator's side of a stage worker: RemoteStage is a pipeline::Stage whose run() is a
// Run call to the worker's StageServer (stage_server.h), so the orchestrator drives local and
// remote stages with the same code.
//
// Errors keep the worker's meaning: the stage's own StageError comes back with its code, stage
// and message; a worker that dies or shuts down mid-request is kUnavailable naming the stage
// and address (the orchestrator may restart it); a passed deadline is kDeadlineExceeded.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/pipeline/stage.h"

namespace grpc {
class Channel;
}

namespace omni::rpc {

struct ClientOptions {
  std::string name;   // "stage 1 (talker)": every error names it; empty = "worker at <address>"
  std::string token;  // sent as "authorization: Bearer <token>"; empty = none
  std::string tls_ca_file;  // PEM bundle that signed the worker's certificate; empty = no TLS
  // The name checked against the worker's certificate; empty = the host of the address.
  std::string tls_server_name;
  // How long run() waits for a connection to the worker before kUnavailable.
  std::chrono::milliseconds connect_timeout{10000};
  // The deadline of the unary calls (stats, info, device).
  std::chrono::milliseconds rpc_timeout{10000};
};

// What the worker's Info RPC reports.
struct WorkerInfo {
  std::string stage;  // its name, e.g. "stage 1 (talker)"
  int64_t stage_id = 0;
  std::string model_stage;  // a registered kind
  int64_t pid = 0;
  std::string info_json;
};

class RemoteStage : public pipeline::Stage {
 public:
  // Connects lazily: constructing never fails for an unreachable worker (wait_healthy does).
  RemoteStage(std::string address, ClientOptions options = {});
  ~RemoteStage() override;

  const std::string& name() const override { return name_; }
  const std::string& address() const { return address_; }

  // One Run call: the header and media, then `input`'s packets as they arrive (a thread of its
  // own), while this thread hands the worker's packets to `sink`. `cancel` cancels the call;
  // the call's deadline becomes the gRPC deadline. A failed upstream (input's pop throws)
  // cancels the call and its error is rethrown.
  void run(const pipeline::StageCall& call, pipeline::PacketQueue& input,
           const pipeline::PacketSink& sink, const pipeline::CancelToken& cancel) override;
  std::string stats_json() override;
  pipeline::StageInfo info() override;
  uint64_t set_device_released(bool release) override;
  uint64_t device_bytes() override;
  WorkerInfo worker_info();

 private:
  struct Impl;
  std::string address_, name_;
  std::unique_ptr<Impl> impl_;
};

// A channel to a worker with the message size limit of wire.h, TLS and keepalive from
// `options`.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options);

// Polls the worker's health service until it reports SERVING (true) or `timeout` passes
// (false, with the last answer or transport error in *why when given). Needs no token (the
// options' token goes along when given).
bool wait_healthy(const std::string& address, const ClientOptions& options,
                  std::chrono::milliseconds timeout, std::string* why = nullptr);

}  // namespace omni::rpc
