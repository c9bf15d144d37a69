// cpp-httplib's server with every connection bounded: a deadline for the whole request head
// and one for the body (not per read, so a client dripping a byte at a time cannot hold on), a
// cap on the head's size, on open connections and on idle keep-alive time, and a thread per
// connection, so a slow client holds only its own thread and never one another client needs.
// TLS is done here too (OpenSSL), under the same deadlines.
//
// httplib 0.11 reads a request with per-read timeouts on a fixed thread pool; it lets a derived
// server run its own connection loop around `process_request`, which is what this does.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/http/connection_limits.h"

namespace omni::http {

class BoundedHttpServer : public httplib::Server {
 public:
  // With `tls_cert` and `tls_key` (PEM files): HTTPS; throws naming the files when they are
  // unreadable or not a pair.
  explicit BoundedHttpServer(ConnectionLimits limits, const std::string& tls_cert = "",
                             const std::string& tls_key = "");
  ~BoundedHttpServer() override;
  BoundedHttpServer(const BoundedHttpServer&) = delete;
  BoundedHttpServer& operator=(const BoundedHttpServer&) = delete;

  // The socket of the request this thread's handler serves; -1 outside a handler.
  static int current_socket();
  // True once the client of `socket` has closed or reset its side: a handler that computes
  // for long polls this to stop work nobody will read. Safe from any thread while the
  // handler runs. A client that only shuts down its sending side counts as gone.
  static bool client_gone(int socket);
  // The connection of this thread's handler is closed after its response (a request whose
  // body was not read cannot be followed by another on the same connection).
  static void close_after_response();

  // Re-listens on this process's listening socket bound to `port` (after bind_to_port) with
  // the kernel's largest backlog. httplib (Debian's library) listens with a backlog of 5: a
  // burst of connections overflows it, and a client whose SYN is dropped waits the kernel's
  // 1 s retransmit. False when no such socket was found.
  static bool widen_listen_backlog(int port);

  int open_connections() const { return open_.load(); }
  uint64_t refused_connections() const { return refused_.load(); }
  uint64_t timed_out_requests() const { return timed_out_.load(); }

 private:
  class Connection;
  class ConnectionThreads;
  bool process_and_close_socket(socket_t sock) override;
  void refuse(socket_t sock);

  ConnectionLimits limits_;
  std::shared_ptr<void> tls_;  // SSL_CTX, freed with SSL_CTX_free
  std::atomic<int> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> timed_out_{0};
};

}  // namespace omni::http
