// Who may talk to a stage worker: a shared token checked on every call, TLS for the transport,
// and the rule that only loopback listeners may do without either.
//
// The token travels as plain call metadata (`authorization: Bearer <token>`) rather than as gRPC
// call credentials: gRPC refuses to send call credentials over an insecure channel, and a token
// on a loopback channel without TLS is the common case (workers on the orchestrator's host).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>
#include <string_view>

namespace omni {
class RateLimitedLog;  // cpu_offload/logging.h
}  // namespace omni

namespace omni::rpc {

constexpr const char* kAuthMetadataKey = "authorization";
// The environment variable a launcher hands a local worker its token in (`vllm-omni worker`
// reads it when no --auth-token-file is given): a command line is world-readable in /proc, the
// environment only by the same user, who could read the orchestrator's memory anyway.
constexpr const char* kWorkerTokenEnv = "OMNI_WORKER_TOKEN";

// The metadata value for `token`: "Bearer <token>".
std::string bearer(const std::string& token);

// A token file's content without trailing whitespace (the newline editors add). Throws
// std::runtime_error naming the file when it cannot be read or holds no token.
std::string read_token_file(const std::string& path);

// A fresh token: 256 bits from the kernel's CSPRNG (getrandom, else /dev/urandom) as 64 hex
// digits. Throws std::runtime_error when neither can be read.
std::string random_token();

// Compares in time that depends on the lengths only, not on where the first difference is.
bool constant_time_equal(std::string_view a, std::string_view b);

// The server side of the token: the stage service calls check() first in every RPC (the health
// service does not, so that probes need no secret).
class TokenCheck {
 public:
  explicit TokenCheck(std::string token);  // empty: every call passes
  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED after logging "refused request from <peer>: missing token" (or
  // "wrong token") as a warning, at a bounded rate: a client retrying a wrong token in a loop
  // cannot fill the log.
  grpc::Status check(const grpc::ServerContext& context) const;

 private:
  std::string token_;
  std::shared_ptr<RateLimitedLog> log_;
};

// TLS credentials from PEM files; errors (std::runtime_error) name the file. Both files empty:
// insecure credentials; only one given: std::invalid_argument.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& cert_file,
                                                            const std::string& key_file);
// Verifies the server against the CA bundle in `ca_file`; empty: an insecure channel.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const std::string& ca_file);

// 127.x.x.x, ::1, localhost (with a port or not, IPv6 in brackets) and unix sockets.
bool is_loopback_address(const std::string& address);

}  // namespace omni::rpc
