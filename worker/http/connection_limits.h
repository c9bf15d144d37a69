// What one HTTP connection may hold: the limits BoundedHttpServer enforces (bounded_http_server.h).
#pragma once

#include <chrono>
#include <cstddef>

namespace omni::http {

struct ConnectionLimits {
  // Open connections; more are answered 503 and closed at once.
  int max_connections = 256;
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
};

}  // namespace omni::http
