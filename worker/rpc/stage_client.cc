#include "worker/rpc/stage_client.h"

#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "health.grpc.pb.h"
#include "stage.grpc.pb.h"
#include "worker/rpc/auth.h"
#include "worker/rpc/grpc_runtime.h"
#include "worker/rpc/wire.h"

namespace omni::rpc {
namespace {

using pipeline::StageError;
using Code = StageError::Code;
using SystemClock = std::chrono::system_clock;

// How often the watcher of a running call looks at the caller's CancelToken (a poll: the token
// has no callback).
constexpr auto kCancelPoll = std::chrono::milliseconds(10);

std::string millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::string grpc_code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    default:
      return "status " + std::to_string(static_cast<int>(code));
  }
}

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes + (64 << 10)));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes + (64 << 10)));
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  // A worker whose host vanishes (no TCP reset) is noticed within keepalive time + timeout,
  // also on a long request that sends nothing; the server accepts pings this often.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A restarted worker is found again within a second or two, not after gRPC's default
  // backoff (up to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(address, channel_credentials(options.tls_ca_file), args);
}

struct RemoteStage::Impl {
  std::string address;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::StageService::Stub> stub;

  void prepare(grpc::ClientContext& context) const {
    if (!options.token.empty()) context.AddMetadata(kAuthMetadataKey, bearer(options.token));
  }
  // The StageError for a failed call: the transport's status in the stage's terms.
  StageError error_for(const std::string& name, const grpc::Status& status, bool mid_request,
                       bool sent_header) const;
  template <typename Request, typename Response, typename Method>
  Response unary(const std::string& name, Method method, const Request& request) const;
};

StageError RemoteStage::Impl::error_for(const std::string& name, const grpc::Status& status,
                                        bool mid_request, bool sent_header) const {
  const std::string worker = "the worker at " + address;
  const std::string detail = " (" + grpc_code_name(status.error_code()) +
                             (status.error_message().empty() ? "" : ": ") + status.error_message() +
                             ")";
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StageError(Code::kDeadlineExceeded, name,
                        "the deadline passed before " + worker + " answered");
    case grpc::StatusCode::UNAUTHENTICATED:
      return StageError(Code::kInvalidArgument, name,
                        worker + " refused the token (" +
                            (options.token.empty() ? "none was given" : "a wrong one was given") +
                            "): " + status.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StageError(Code::kInvalidArgument, name, worker + ": " + status.error_message());
    default:
      break;
  }
  if (!sent_header && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return StageError(Code::kUnavailable, name, "cannot reach " + worker + detail);
  }
  return StageError(Code::kUnavailable, name,
                    worker + (mid_request ? " failed mid-request" : " failed") + detail);
}

template <typename Request, typename Response, typename Method>
Response RemoteStage::Impl::unary(const std::string& name, Method method,
                                  const Request& request) const {
  grpc::ClientContext context;
  prepare(context);
  context.set_deadline(SystemClock::now() + options.rpc_timeout);
  Response response;
  const grpc::Status status = (stub.get()->*method)(&context, request, &response);
  if (!status.ok()) throw error_for(name, status, false, true);
  return response;
}

RemoteStage::RemoteStage(std::string address, ClientOptions options)
    : address_(std::move(address)),
      name_(options.name.empty() ? "worker at " + address_ : options.name),
      impl_(std::make_unique<Impl>()) {
  keep_grpc_initialized();
  impl_->address = address_;
  impl_->options = std::move(options);
  impl_->channel = make_channel(address_, impl_->options);
  impl_->stub = proto::StageService::NewStub(impl_->channel);
}

RemoteStage::~RemoteStage() = default;

void RemoteStage::run(const pipeline::StageCall& call, pipeline::PacketQueue& input,
                      const pipeline::PacketSink& sink, const pipeline::CancelToken& cancel) {
  if (cancel.cancelled()) throw StageError(Code::kCancelled, name_, "the request was cancelled");
  grpc::ClientContext context;
  impl_->prepare(context);
  if (call.deadline != std::chrono::steady_clock::time_point::max()) {
    context.set_deadline(SystemClock::now() +
                         std::chrono::duration_cast<SystemClock::duration>(
                             call.deadline - std::chrono::steady_clock::now()));
  }
  // A call on a channel that is not connected fails at once (UNAVAILABLE): give a starting or
  // restarting worker connect_timeout first (bounded by the request's deadline).
  if (impl_->channel->GetState(true) != GRPC_CHANNEL_READY) {
    auto until = SystemClock::now() + impl_->options.connect_timeout;
    until = std::min(until, context.deadline());
    if (!impl_->channel->WaitForConnected(until)) {
      if (SystemClock::now() >= context.deadline()) {
        throw StageError(
            Code::kDeadlineExceeded, name_,
            "the deadline passed before the worker at " + address_ + " could be reached");
      }
      throw StageError(Code::kUnavailable, name_,
                       "cannot reach the worker at " + address_ + " within " +
                           millis(impl_->options.connect_timeout));
    }
  }

  // The watcher: the caller's cancellation becomes the call's (from the start: a large media
  // upload may take a while). `stop` ends the writer's wait for input when the call is over.
  pipeline::CancelToken stop;
  std::mutex done_mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::atomic<bool> cancelled{false};
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(done_mutex);
    while (!done) {
      if (cancel.cancelled()) {
        cancelled = true;
        stop.cancel();
        context.TryCancel();
        return;
      }
      done_changed.wait_for(lock, kCancelPoll);
    }
  });

  auto stream = impl_->stub->Run(&context);
  proto::RunRequest first;
  proto::RunHeader* header = first.mutable_header();
  header->set_request_id(call.request_id);
  header->set_params_json(call.params ? call.params->to_json() : "");
  put_media_header(call.media, header);
  bool write_ok = stream->Write(first);
  split_media_rest(call.media, *header, [&](proto::MediaFile&& chunk) {
    if (!write_ok) return;
    proto::RunRequest request;
    *request.mutable_media() = std::move(chunk);
    write_ok = stream->Write(request);
  });

  // The writer: upstream packets as they arrive, then upstream_done and the half-close.
  std::exception_ptr upstream_error;
  std::thread writer([&] {
    bool ok = write_ok;
    try {
      while (ok) {
        std::optional<pipeline::StagePacket> packet = input.pop(&stop);
        if (!packet) break;
        split_packet(*packet, [&](proto::Packet&& message) {
          if (!ok) return;
          proto::RunRequest request;
          *request.mutable_upstream() = std::move(message);
          ok = stream->Write(request);
        });
      }
      if (ok) {
        proto::RunRequest last;
        last.set_upstream_done(true);
        stream->Write(last);
      }
    } catch (...) {
      if (!stop.cancelled()) {  // the upstream failed: this request is over
        upstream_error = std::current_exception();
        context.TryCancel();
      }
    }
    stream->WritesDone();
  });

  PacketAssembler assembler;
  std::optional<StageError> remote_error;
  std::exception_ptr local_error;  // the sink's, or a malformed packet's
  bool finished = false, received = false;
  proto::RunResponse response;
  while (stream->Read(&response)) {
    received = true;
    if (local_error) continue;  // cancelled: drain what is in flight
    if (response.has_error()) {
      remote_error = from_proto(response.error());
      stop.cancel();
      continue;
    }
    if (!response.has_packet()) continue;
    std::optional<pipeline::StagePacket> packet;
    try {
      packet = assembler.add(response.packet());
    } catch (const StageError& e) {
      local_error = std::make_exception_ptr(
          StageError(Code::kInternal, name_, "the worker at " + address_ + " sent " + e.message()));
    }
    if (packet) {
      finished = finished || packet->finished;
      // The worker sends nothing after its last packet: stop the writer now, so that the
      // half-close lets the worker's handler end without waiting for the upstream.
      if (packet->finished) stop.cancel();
      try {
        sink(std::move(*packet));
      } catch (...) {  // the downstream went away (or failed)
        local_error = std::current_exception();
      }
    }
    if (local_error) {
      stop.cancel();
      context.TryCancel();
    }
  }
  stop.cancel();
  writer.join();
  {
    std::lock_guard<std::mutex> lock(done_mutex);
    done = true;
    done_changed.notify_all();
  }
  watcher.join();
  const grpc::Status status = stream->Finish();

  if (upstream_error) std::rethrow_exception(upstream_error);
  if (local_error) std::rethrow_exception(local_error);
  if (remote_error) {
    if (remote_error->stage().empty()) {
      throw StageError(remote_error->code(), name_, remote_error->message());
    }
    throw *remote_error;
  }
  if (cancelled) throw StageError(Code::kCancelled, name_, "the request was cancelled");
  if (finished) return;  // the output is complete, whatever happened to the call after it
  if (!status.ok()) {
    // Whichever side's timer fired first, a passed deadline is the reason.
    if (std::chrono::steady_clock::now() >= call.deadline) {
      throw StageError(Code::kDeadlineExceeded, name_,
                       "the deadline passed before the worker at " + address_ + " finished");
    }
    throw impl_->error_for(name_, status, received || write_ok, write_ok);
  }
  if (assembler.in_progress()) {
    throw StageError(Code::kUnavailable, name_,
                     "the worker at " + address_ + " ended the request in the middle of a packet");
  }
}

// The Stats RPC answers {"server": <the worker's counters>, "stage": <the stage's figures>}. A
// pipeline reports every stage alike, in process or not: the figures, with the worker's counters
// under "worker".
std::string RemoteStage::stats_json() {
  std::string wire = impl_
                         ->unary<proto::StatsRequest, proto::StatsResponse>(
                             name_, &proto::StageService::Stub::Stats, proto::StatsRequest())
                         .json();
  nlohmann::json answer = nlohmann::json::parse(wire, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) return wire;
  nlohmann::json stage = answer.contains("stage") && answer["stage"].is_object()
                             ? answer["stage"]
                             : nlohmann::json::object();
  stage["worker"] = answer.value("server", nlohmann::json::object());
  return stage.dump();
}

WorkerInfo RemoteStage::worker_info() {
  const proto::InfoResponse info = impl_->unary<proto::InfoRequest, proto::InfoResponse>(
      name_, &proto::StageService::Stub::Info, proto::InfoRequest());
  return WorkerInfo{info.stage(), info.stage_id(), info.model_stage(), info.pid(),
                    info.info_json()};
}

pipeline::StageInfo RemoteStage::info() { return info_from_json(worker_info().info_json); }

uint64_t RemoteStage::set_device_released(bool release) {
  proto::DeviceRequest request;
  request.set_release(release);
  return impl_
      ->unary<proto::DeviceRequest, proto::DeviceResponse>(
          name_, &proto::StageService::Stub::Device, request)
      .moved_bytes();
}

uint64_t RemoteStage::device_bytes() {
  proto::DeviceRequest request;
  request.set_query(true);  // release unset alone would mean "prefetch"
  return impl_
      ->unary<proto::DeviceRequest, proto::DeviceResponse>(
          name_, &proto::StageService::Stub::Device, request)
      .device_bytes();
}

bool wait_healthy(const std::string& address, const ClientOptions& options,
                  std::chrono::milliseconds timeout, std::string* why) {
  keep_grpc_initialized();
  const auto channel = make_channel(address, options);
  const auto stub = grpc::health::v1::Health::NewStub(channel);
  const auto end = SystemClock::now() + timeout;
  std::string last = "no answer";
  bool answered = false;
  while (true) {
    grpc::ClientContext context;
    // The health service needs no token; it goes along as on the orchestrator's other calls.
    if (!options.token.empty()) context.AddMetadata(kAuthMetadataKey, bearer(options.token));
    context.set_deadline(std::min(end, SystemClock::now() + std::chrono::seconds(1)));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    // The last attempt may get only the few ms left of `timeout` and end in DEADLINE_EXCEEDED:
    // an earlier, more telling answer (NOT_SERVING, connection refused) is kept then.
    if (status.ok()) {
      last = "it reports " +
             grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
    } else if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || !answered) {
      last = grpc_code_name(status.error_code()) + ": " + status.error_message();
    }
    answered = answered || status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
    const auto now = SystemClock::now();
    if (now >= end) break;
    std::this_thread::sleep_for(
        std::min<SystemClock::duration>(std::chrono::milliseconds(50), end - now));
  }
  if (why) {
    *why = "the worker at " + address + " was not healthy within " + millis(timeout) + " (" + last +
           ")";
  }
  return false;
}

}  // namespace omni::rpc
