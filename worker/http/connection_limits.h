// What one HTTP connection may hold: the limits BoundedHttpServer enforces (bounded_http_server.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace omni::http {

struct ConnectionLimits {
  // Open connections, and those of one client address among them. Connections over either go
  // to the overflow lane (overflow_lane.h), which answers /health and /metrics and refuses the
  // rest; over the lane's own caps they are answered 503 and closed at once.
  int max_connections = 256;
  int max_connections_per_client = 64;
  int overflow_connections = 256;
  int overflow_connections_per_client = 16;
  std::chrono::milliseconds overflow_timeout{2000};
  // The whole request head, from its first byte (TLS handshake included).
  std::chrono::milliseconds head_timeout{10000};
  // The whole body, from the end of the head.
  std::chrono::milliseconds body_timeout{60000};
  // Keep-alive: how long a connection may wait for its next request.
  std::chrono::milliseconds idle_timeout{5000};
  // Each write: a client that stops reading its answer.
  std::chrono::milliseconds write_timeout{10000};
  size_t max_head_bytes = size_t{64} << 10;
  int max_requests_per_connection = 100;
  // A connection closed before its request body was read (a refusal from the head) first reads
  // and drops what the client still sends, up to these, so that its client reads the answer
  // instead of a reset. Dropping costs no memory, so the byte cap only bounds the bandwidth
  // spent on a body that is not wanted (a refused 4 MiB + 2 MiB body must still read its 413).
  std::chrono::milliseconds linger_timeout{2000};
  uint64_t linger_bytes = uint64_t{64} << 20;
  // Ranges of a Range header kept (on the routes that take one); more: the whole content.
  size_t max_ranges = 8;
};

}  // namespace omni::http
