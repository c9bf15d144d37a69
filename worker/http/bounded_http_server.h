// cpp-httplib's server with every connection bounded. A thread per connection, so a slow client
// holds only its own thread; caps on connections in all and per client address; when the pool
// is full, a newcomer takes the place of the oldest idle connection of the client that holds the
// most (so clients of many addresses cannot lock others out); the surplus on the overflow lane
// (overflow_lane.h); a deadline for the whole request head and one for the
// body (not per read, so a client dripping a byte at a time cannot hold on); a cap on the head's
// size and on idle keep-alive time. TLS is done here too (OpenSSL), under the same deadlines.
//
// The connection reads each request head itself before httplib sees it: the body is exactly the
// bytes its Content-Length announces (none without one, so httplib never reads "until the client
// closes"), and a Range header reaches httplib only where a route serves ranges and only when it
// is small. A failure anywhere in the loop (an exception, std::bad_alloc included) ends that
// connection with a 500 when nothing was sent yet, one rate-limited log line, and nothing else.
//
// httplib 0.11 reads a request with per-read timeouts on a fixed thread pool; it lets a derived
// server run its own connection loop around `process_request`, which is what this does.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "worker/http/connection_limits.h"
#include "worker/http/http_head.h"
#include "worker/http/overflow_lane.h"

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

  // The requests whose Range header is kept (when it parses and is within max_ranges); every
  // other request loses it before httplib parses it. Default: none. Set before listening.
  void set_range_routes(std::function<bool(const HttpHead&)> keeps_range);
  // What the overflow lane answers (a whole HTTP response). Without it (and always with TLS),
  // connections over the caps are answered 503 and closed at once. Set before listening.
  void set_overflow_answer(OverflowLane::Answer answer);

  // The socket of the request this thread's handler serves; -1 outside a handler.
  static int current_socket();
  // The address of the client this thread's handler serves; "" outside a handler.
  static const std::string& current_client();
  // True once the client of `socket` has closed or reset its side: a handler that computes
  // for long polls this to stop work nobody will read. Safe from any thread while the
  // handler runs. A client that only shuts down its sending side counts as gone.
  static bool client_gone(int socket);
  // The connection of this thread's handler is closed after its response (a request whose
  // body was not read cannot be followed by another on the same connection).
  static void close_after_response();
  // Keeps `held` alive until this thread's request has been answered (its response written,
  // streamed responses included): what the request holds in the byte budget, say.
  static void hold_until_answered(std::shared_ptr<void> held);

  // Re-listens on this process's listening socket bound to `port` (after bind_to_port) with
  // the kernel's largest backlog. httplib (Debian's library) listens with a backlog of 5: a
  // burst of connections overflows it, and a client whose SYN is dropped waits the kernel's
  // 1 s retransmit. False when no such socket was found.
  static bool widen_listen_backlog(int port);

  int open_connections() const { return open_.load(); }
  // Connections answered 503 and closed at once (over every cap, the lane's included).
  uint64_t refused_connections() const { return refused_.load(); }
  // Connections handed to the overflow lane.
  uint64_t overflowed_connections() const { return overflowed_.load(); }
  // Idle connections closed to make room for a client that held fewer.
  uint64_t evicted_connections() const { return evicted_.load(); }
  uint64_t timed_out_requests() const { return timed_out_.load(); }
  // Connections that ended on an exception in the connection loop.
  uint64_t failed_connections() const { return failed_.load(); }

 protected:
  // Each request head, before httplib reads it. An exception here ends the connection as any
  // failure of the loop does (the fault-injection tests throw here).
  virtual void on_request_head(const HttpHead& head);

 private:
  class Connection;
  class ConnectionThreads;
  struct ConnectionState;
  struct Slot;  // an admitted connection: its socket, client, and whether a request is running
  bool process_and_close_socket(socket_t sock) override;
  // On the accepting thread: a thread for `sock`, the overflow lane, or a 503.
  void admit(socket_t sock);
  // With state_'s mutex held, the pool full: shuts down the oldest idle connection (waiting for
  // or reading a request head) of the client with the most connections, when that client holds
  // more than `mine` + 1. Its thread ends within a wait slice.
  void make_room(int mine);
  // Marks `slot` (null: not admitted through admit()) as running a request or not; false when
  // it was evicted, and the connection must end.
  bool set_busy(Slot* slot, bool busy);
  // Serves requests on `sock` until it closes; shuts the socket down but leaves closing it to
  // the caller (an evictor may still hold its number until the slot is gone).
  void serve(socket_t sock, const std::string& client, Slot* slot);
  void refuse(socket_t sock);
  static void end_request();
  // The loop's exception: counted, logged at a bounded rate, a 500 when nothing was sent.
  void failed(Connection& connection, const std::string& client, const char* what);

  ConnectionLimits limits_;
  std::shared_ptr<void> tls_;  // SSL_CTX, freed with SSL_CTX_free
  std::function<bool(const HttpHead&)> keeps_range_;
  std::unique_ptr<OverflowLane> lane_;

  std::shared_ptr<ConnectionState> state_;  // its mutex guards clients_, slots_, evicting_
  std::map<std::string, int> clients_;      // open connections by client address
  std::list<std::shared_ptr<Slot>> slots_;  // oldest first
  int evicting_ = 0;                        // shut down, their threads not ended yet
  std::atomic<int> open_{0};
  std::atomic<uint64_t> refused_{0}, overflowed_{0}, evicted_{0}, timed_out_{0}, failed_{0};
};

}  // namespace omni::http
