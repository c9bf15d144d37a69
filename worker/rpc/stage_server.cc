#include "worker/rpc/stage_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "stage.grpc.pb.h"
#include "worker/rpc/auth.h"
#include "worker/rpc/grpc_runtime.h"
#include "worker/rpc/wire.h"

namespace omni::rpc {
namespace {

using pipeline::StageError;
using Code = StageError::Code;
using Clock = std::chrono::steady_clock;

// A well-behaved client half-closes its stream as soon as it reads the last packet; one that
// does not is cut off after this long, so that it cannot hold a handler thread forever.
constexpr auto kHalfCloseWait = std::chrono::seconds(2);
// How often a running request looks for its client's cancellation: the synchronous API has no
// notification for it (IsCancelled is a poll).
constexpr auto kCancelPoll = std::chrono::milliseconds(20);
// After the drain, what remains gets this long to send its in-band error before gRPC cancels.
constexpr auto kShutdownCancelAfter = std::chrono::milliseconds(200);

grpc::StatusCode status_code(Code code) {
  switch (code) {
    case Code::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case Code::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case Code::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case Code::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case Code::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case Code::kInternal:
      break;
  }
  return grpc::StatusCode::INTERNAL;
}

// The client's deadline (system clock, as gRPC keeps it) on the steady clock of StageCall.
Clock::time_point steady_deadline(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(deadline - std::chrono::system_clock::now());
}

// One Run in progress, as shutdown() sees it.
struct ActiveCall {
  pipeline::CancelToken cancel;
  std::atomic<bool> shut_down{false};
};

using RunStream = grpc::ServerReaderWriter<proto::RunResponse, proto::RunRequest>;

}  // namespace

class StageServer::Impl final : public proto::StageService::Service {
 public:
  Impl(pipeline::Stage& stage, int64_t stage_id, std::string model_stage, ServerOptions options)
      : stage_(stage),
        stage_id_(stage_id),
        model_stage_(std::move(model_stage)),
        options_(std::move(options)),
        auth_(options_.token) {}

  void start();
  void shutdown(std::chrono::milliseconds grace);
  void wait();
  std::string address() const;
  int port() const { return port_; }
  std::string counters_json() const;

  grpc::Status Run(grpc::ServerContext* context, RunStream* stream) override;
  grpc::Status Stats(grpc::ServerContext* context, const proto::StatsRequest* request,
                     proto::StatsResponse* response) override;
  grpc::Status Info(grpc::ServerContext* context, const proto::InfoRequest* request,
                    proto::InfoResponse* response) override;
  grpc::Status Device(grpc::ServerContext* context, const proto::DeviceRequest* request,
                      proto::DeviceResponse* response) override;

 private:
  // The request itself, after auth and the drain check; returns the stage's error, if any.
  std::optional<StageError> serve(grpc::ServerContext* context, RunStream* stream,
                                  ActiveCall& active);
  // Runs a unary RPC body, turning exceptions into a status.
  template <typename Body>
  grpc::Status unary(grpc::ServerContext* context, Body body);
  StageError named(const StageError& error) const {
    return error.stage().empty() ? StageError(error.code(), stage_.name(), error.message()) : error;
  }

  pipeline::Stage& stage_;
  const int64_t stage_id_;
  const std::string model_stage_;
  const ServerOptions options_;
  const TokenCheck auth_;

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool draining_ = false, stopping_ = false, stopped_ = false;
  std::set<ActiveCall*> active_;

  std::atomic<uint64_t> started_{0}, completed_{0}, failed_{0}, cancelled_{0}, refused_{0},
      rejected_draining_{0};
};

void StageServer::Impl::start() {
  // Process-wide switch of gRPC: every server built after it serves grpc.health.v1.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen_address,
                           server_credentials(options_.tls_cert_file, options_.tls_key_file),
                           &port_);
  builder.RegisterService(this);
  // Messages stay under kMaxMessageBytes by construction (wire.h); the slack is for framing.
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes + (64 << 10)));
  builder.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes + (64 << 10)));
  // gRPC sets SO_REUSEPORT by default: a second worker on the same port would then start
  // without error and silently take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Accept the clients' keepalive pings (stage_client.cc) on long silent requests.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    throw std::runtime_error("the stage worker cannot listen on " + options_.listen_address +
                             " (port in use, or not an address of this host)");
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
}

std::string StageServer::Impl::address() const {
  const std::string& listen = options_.listen_address;
  const size_t colon = listen.rfind(':');
  if (port_ == 0 || colon == std::string::npos || listen.rfind("unix", 0) == 0) return listen;
  return listen.substr(0, colon + 1) + std::to_string(port_);
}

void StageServer::Impl::shutdown(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!server_ || stopped_) return;
    if (stopping_) {  // another thread drains: wait for it
      changed_.wait(lock, [&] { return stopped_; });
      return;
    }
    stopping_ = draining_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, grace, [&] { return active_.empty(); });
    for (ActiveCall* call : active_) {
      call->shut_down = true;
      call->cancel.cancel();
    }
  }
  // Returns when every handler has returned: stages must honour their CancelToken.
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownCancelAfter);
  server_->Wait();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  changed_.notify_all();
}

void StageServer::Impl::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return stopped_ || !server_; });
}

std::string StageServer::Impl::counters_json() const {
  size_t in_flight;
  bool draining;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight = active_.size();
    draining = draining_;
  }
  std::ostringstream out;
  out << "{\"requests_started\": " << started_ << ", \"requests_completed\": " << completed_
      << ", \"requests_failed\": " << failed_ << ", \"requests_cancelled\": " << cancelled_
      << ", \"requests_refused\": " << refused_
      << ", \"requests_rejected_draining\": " << rejected_draining_
      << ", \"in_flight\": " << in_flight << ", \"draining\": " << (draining ? "true" : "false")
      << "}";
  return out.str();
}

grpc::Status StageServer::Impl::Run(grpc::ServerContext* context, RunStream* stream) {
  if (grpc::Status status = auth_.check(*context); !status.ok()) {
    ++refused_;
    return status;
  }
  ActiveCall active;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) {
      ++rejected_draining_;
      proto::RunResponse response;
      *response.mutable_error() =
          to_proto(StageError(Code::kUnavailable, stage_.name(), "the worker is shutting down"));
      stream->Write(response);
      return grpc::Status::OK;
    }
    active_.insert(&active);
  }
  ++started_;
  std::optional<StageError> error;
  try {
    error = serve(context, stream, active);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    active_.erase(&active);
    changed_.notify_all();
    throw;
  }
  if (!error) {
    ++completed_;
  } else if (error->code() == Code::kCancelled || error->code() == Code::kDeadlineExceeded) {
    ++cancelled_;
  } else {
    ++failed_;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  active_.erase(&active);
  changed_.notify_all();
  return grpc::Status::OK;
}

std::optional<StageError> StageServer::Impl::serve(grpc::ServerContext* context, RunStream* stream,
                                                   ActiveCall& active) {
  std::mutex write_mutex;  // a stage may call its sink from more than one thread
  // The error goes to the client in-band, before the client's half-close is awaited: the client
  // half-closes when it reads the request's last message.
  const auto fail = [&](const StageError& error) {
    proto::RunResponse response;
    *response.mutable_error() = to_proto(error);
    std::lock_guard<std::mutex> lock(write_mutex);
    stream->Write(response);  // fails when the client went away: nothing more to do then
    return error;
  };
  proto::RunRequest first;
  if (!stream->Read(&first)) {
    return fail(StageError(Code::kCancelled, stage_.name(), "the client sent no header"));
  }
  if (!first.has_header()) {
    return fail(StageError(Code::kInvalidArgument, stage_.name(),
                           "the first message of a Run call must be its header"));
  }
  pipeline::StageCall call;
  call.request_id = first.header().request_id();
  // The stage's kind reads the JSON (pipeline::params_as).
  call.params = std::make_shared<const pipeline::JsonParams>(first.header().params_json());
  call.deadline = steady_deadline(context->deadline());
  try {
    MediaAssembler media;
    media.add_header(first.header());
    while (!media.complete()) {
      proto::RunRequest request;
      if (!stream->Read(&request)) {
        return fail(StageError(Code::kCancelled, stage_.name(), "the client went away"));
      }
      if (!request.has_media()) {
        return fail(StageError(Code::kInvalidArgument, stage_.name(),
                               "a message other than media before all media arrived"));
      }
      media.add(request.media());
    }
    call.media = media.take();
  } catch (const StageError& e) {
    return fail(named(e));
  }

  // The reader: upstream packets into `input` while the stage runs; then, until the request
  // ends, watches for the client's cancellation.
  pipeline::PacketQueue input;
  std::mutex done_mutex;
  std::condition_variable done_changed;
  bool done = false, reader_done = false;
  std::thread reader([&] {
    try {
      WireLimits limits;
      limits.max_request_bytes = options_.max_upstream_bytes;
      PacketAssembler assembler(limits);
      proto::RunRequest request;
      bool ended = false;
      while (!ended && stream->Read(&request)) {
        if (request.has_upstream()) {
          if (auto packet = assembler.add(request.upstream())) input.push(std::move(*packet));
        } else if (request.kind_case() == proto::RunRequest::kUpstreamDone) {
          if (assembler.in_progress()) {
            throw StageError(Code::kInvalidArgument, "",
                             "upstream_done in the middle of a chunked packet");
          }
          ended = true;
        } else {
          throw StageError(Code::kInvalidArgument, "",
                           "a header or media message after the header's media");
        }
      }
      if (!ended && context->IsCancelled()) {
        active.cancel.cancel();
        input.close(std::make_exception_ptr(
            StageError(Code::kCancelled, "", "the client cancelled the request")));
      } else {
        input.close();  // upstream_done, or a plain half-close
      }
    } catch (...) {
      input.close(std::current_exception());
    }
    std::unique_lock<std::mutex> lock(done_mutex);
    while (!done) {
      if (context->IsCancelled()) {
        active.cancel.cancel();
        break;
      }
      done_changed.wait_for(lock, kCancelPoll);
    }
    reader_done = true;
    done_changed.notify_all();
  });

  const pipeline::PacketSink sink = [&](pipeline::StagePacket&& packet) {
    if (active.cancel.cancelled() || context->IsCancelled()) {
      active.cancel.cancel();
      throw StageError(Code::kCancelled, stage_.name(), "the request was cancelled");
    }
    std::lock_guard<std::mutex> lock(write_mutex);
    split_packet(packet, [&](proto::Packet&& message) {
      proto::RunResponse response;
      *response.mutable_packet() = std::move(message);
      if (!stream->Write(response)) {
        active.cancel.cancel();
        throw StageError(Code::kCancelled, stage_.name(), "the client went away");
      }
    });
  };

  std::optional<StageError> error;
  try {
    stage_.run(call, input, sink, active.cancel);
  } catch (const StageError& e) {
    error = named(e);
  } catch (const std::exception& e) {
    error = StageError(Code::kInternal, stage_.name(), e.what());
  } catch (...) {
    error = StageError(Code::kInternal, stage_.name(), "an unknown exception");
  }
  if (error && active.shut_down) {
    error = StageError(Code::kUnavailable, stage_.name(),
                       "the worker shut down before the request finished");
  }
  if (error) fail(*error);

  std::unique_lock<std::mutex> lock(done_mutex);
  done = true;
  done_changed.notify_all();
  if (!done_changed.wait_for(lock, kHalfCloseWait, [&] { return reader_done; })) {
    // The reader still waits for the client's next message: only ending the call frees it.
    context->TryCancel();
  }
  lock.unlock();
  reader.join();
  return error;
}

template <typename Body>
grpc::Status StageServer::Impl::unary(grpc::ServerContext* context, Body body) {
  if (grpc::Status status = auth_.check(*context); !status.ok()) {
    ++refused_;
    return status;
  }
  try {
    body();
    return grpc::Status::OK;
  } catch (const StageError& e) {
    return grpc::Status(status_code(e.code()), named(e).what());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, stage_.name() + ": " + e.what());
  }
}

grpc::Status StageServer::Impl::Stats(grpc::ServerContext* context, const proto::StatsRequest*,
                                      proto::StatsResponse* response) {
  return unary(context, [&] {
    std::string stage = stage_.stats_json();
    if (stage.empty()) stage = "null";
    response->set_json("{\"server\": " + counters_json() + ", \"stage\": " + stage + "}");
  });
}

grpc::Status StageServer::Impl::Info(grpc::ServerContext* context, const proto::InfoRequest*,
                                     proto::InfoResponse* response) {
  return unary(context, [&] {
    response->set_stage(stage_.name());
    response->set_stage_id(stage_id_);
    response->set_model_stage(model_stage_);
    response->set_pid(static_cast<int64_t>(::getpid()));
    response->set_info_json(info_to_json(stage_.info()));
  });
}

grpc::Status StageServer::Impl::Device(grpc::ServerContext* context,
                                       const proto::DeviceRequest* request,
                                       proto::DeviceResponse* response) {
  return unary(context, [&] {
    if (!request->query()) {
      response->set_moved_bytes(stage_.set_device_released(request->release()));
    }
    response->set_device_bytes(stage_.device_bytes());
  });
}

// --- StageServer -----------------------------------------------------------------------------

StageServer::StageServer(pipeline::Stage& stage, int64_t stage_id, std::string model_stage,
                         ServerOptions options) {
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && (options.tls_cert_file.empty() || options.tls_key_file.empty())) {
    throw std::invalid_argument(
        "TLS needs both a certificate (--tls-cert) and its key "
        "(--tls-key)");
  }
  if (!is_loopback_address(options.listen_address) && !tls && options.token.empty() &&
      !options.allow_insecure_nonloopback) {
    throw std::invalid_argument(
        "refusing to listen on " + options.listen_address +
        " without TLS or a token: anyone who can reach it could run requests on this worker. "
        "Give --tls-cert/--tls-key or a token file, listen on a loopback address "
        "(127.0.0.1, ::1, localhost), or explicitly allow an insecure listener");
  }
  keep_grpc_initialized();
  impl_ = std::make_unique<Impl>(stage, stage_id, std::move(model_stage), std::move(options));
}

StageServer::~StageServer() { impl_->shutdown(std::chrono::milliseconds(0)); }

void StageServer::start() { impl_->start(); }
std::string StageServer::address() const { return impl_->address(); }
int StageServer::port() const { return impl_->port(); }
void StageServer::shutdown(std::chrono::milliseconds grace) { impl_->shutdown(grace); }
void StageServer::wait() { impl_->wait(); }
std::string StageServer::counters_json() const { return impl_->counters_json(); }

}  // namespace omni::rpc
