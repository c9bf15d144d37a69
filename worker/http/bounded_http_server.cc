#include "worker/http/bounded_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

namespace omni::http {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_socket = -1;
thread_local bool t_close_after = false;
thread_local bool t_refuse = false;

// Waits are cut in slices so that a stopping server is noticed.
constexpr auto kWaitSlice = std::chrono::milliseconds(100);

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kWaitSlice.count()));
}

// What a non-blocking read or write asks for next.
constexpr ssize_t kWantRead = -2;
constexpr ssize_t kWantWrite = -3;

std::string busy_response() {
  const std::string body =
      R"({"error":{"message":"the server has too many open connections: try again later",)"
      R"("type":"server_error","param":null,"code":"too_many_connections"}})";
  return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
}

void address_of(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  auto* raw = reinterpret_cast<sockaddr*>(&addr);
  const int rc = peer ? getpeername(sock, raw, &len) : getsockname(sock, raw, &len);
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  if (rc != 0 || getnameinfo(raw, len, host, sizeof(host), serv, sizeof(serv),
                             NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ip.clear();
    port = 0;
    return;
  }
  ip = host;
  port = std::atoi(serv);
}

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no detail";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

// One client connection as httplib's request parser reads it: a buffered, non-blocking socket
// (plain or TLS) whose reads fail once the current phase's deadline has passed.
class BoundedHttpServer::Connection final : public httplib::Stream {
 public:
  Connection(const BoundedHttpServer& server, int sock, SSL* ssl)
      : server_(server), limits_(server.limits_), sock_(sock), ssl_(ssl) {}

  bool handshake() {
    const auto deadline = Clock::now() + limits_.head_timeout;
    for (;;) {
      ERR_clear_error();
      const int rc = SSL_accept(ssl_);
      if (rc == 1) return true;
      const int err = SSL_get_error(ssl_, rc);
      const short events = err == SSL_ERROR_WANT_READ    ? POLLIN
                           : err == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                         : 0;
      if (events == 0 || !wait(events, deadline)) return false;
    }
  }

  // Waits for the first byte of the next request.
  bool wait_for_request(std::chrono::milliseconds idle) const {
    if (begin_ < end_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0)) return true;
    return wait(POLLIN, Clock::now() + idle);
  }

  void begin_request() {
    in_head_ = true;
    line_has_bytes_ = false;
    head_bytes_ = 0;
    deadline_ = Clock::now() + limits_.head_timeout;
  }
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override { return begin_ < end_ || wait(POLLIN, deadline_); }
  bool is_writable() const override {
    return wait(POLLOUT, Clock::now() + limits_.write_timeout, false);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (begin_ == end_) {
      const ssize_t n = fill();
      if (n <= 0) return n;
    }
    if (!in_head_) {
      const size_t n = std::min(size, end_ - begin_);
      std::memcpy(ptr, buffer_ + begin_, n);
      begin_ += n;
      return static_cast<ssize_t>(n);
    }
    // The head: stop after the empty line that ends it, where the body's deadline starts.
    size_t n = 0;
    while (n < size && begin_ < end_) {
      const char c = buffer_[begin_++];
      ptr[n++] = c;
      if (++head_bytes_ > limits_.max_head_bytes) return -1;
      if (c == '\n') {
        if (!line_has_bytes_) {
          in_head_ = false;
          deadline_ = Clock::now() + limits_.body_timeout;
          break;
        }
        line_has_bytes_ = false;
      } else if (c != '\r') {
        line_has_bytes_ = true;
      }
    }
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = Clock::now() + limits_.write_timeout;
    const size_t chunk = std::min<size_t>(size, INT_MAX);
    for (;;) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int rc = SSL_write(ssl_, ptr, static_cast<int>(chunk));
        n = rc > 0 ? rc : want(rc);
      } else {
        n = send(sock_, ptr, chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0)
          n = (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? kWantWrite : -1;
      }
      if (n >= 0) return n;
      // A stopping server still sends the answers its handlers finish.
      if (n == -1 || !wait(n == kWantRead ? POLLIN : POLLOUT, deadline, false)) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // Reads what the socket has into the buffer: > 0 bytes, 0 at the client's end, -1 on an
  // error, a passed deadline or a stopping server.
  ssize_t fill() {
    for (;;) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int rc = SSL_read(ssl_, buffer_, sizeof(buffer_));
        n = rc > 0 ? rc : want(rc);
      } else {
        n = recv(sock_, buffer_, sizeof(buffer_), MSG_DONTWAIT);
        if (n < 0) n = (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? kWantRead : -1;
      }
      if (n >= 0) {
        begin_ = 0;
        end_ = static_cast<size_t>(n);
        return n;
      }
      if (n == -1) return -1;
      if (!wait(n == kWantRead ? POLLIN : POLLOUT, deadline_)) {
        if (Clock::now() >= deadline_) timed_out_ = true;
        return -1;
      }
    }
  }

  // An SSL call's result <= 0 as: 0 (closed), kWantRead, kWantWrite or -1.
  ssize_t want(int rc) const {
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_ZERO_RETURN:
        return 0;
      case SSL_ERROR_WANT_READ:
        return kWantRead;
      case SSL_ERROR_WANT_WRITE:
        return kWantWrite;
      default:
        return -1;
    }
  }

  // True when `events` came before `deadline` (and, with `until_stop`, before the server began
  // to stop).
  bool wait(short events, Clock::time_point deadline, bool until_stop = true) const {
    for (;;) {
      if (until_stop && server_.svr_sock_ == INVALID_SOCKET) return false;
      pollfd p{sock_, events, 0};
      const int rc = poll(&p, 1, poll_ms(deadline));
      if (rc > 0) return (p.revents & (POLLERR | POLLNVAL)) == 0;
      if (rc < 0 && errno != EINTR) return false;
      if (Clock::now() >= deadline) return false;
    }
  }

  const BoundedHttpServer& server_;
  const ConnectionLimits& limits_;
  int sock_;
  SSL* ssl_;
  char buffer_[16384];
  size_t begin_ = 0, end_ = 0;
  bool in_head_ = true;
  bool line_has_bytes_ = false;
  size_t head_bytes_ = 0;
  bool timed_out_ = false;
  Clock::time_point deadline_ = Clock::now();
};

// httplib hands each accepted socket to a task queue; this one gives each a thread of its own
// (bounded by max_connections), so no client waits for a thread another client holds.
class BoundedHttpServer::ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(BoundedHttpServer& server)
      : server_(server), state_(std::make_shared<State>()) {}

  void enqueue(std::function<void()> fn) override {
    if (server_.open_.load() >= server_.limits_.max_connections) {
      // On the accepting thread: a 503 sent without waiting, and the socket closed.
      t_refuse = true;
      fn();
      t_refuse = false;
      return;
    }
    ++server_.open_;
    std::thread([server = &server_, state = state_, fn = std::move(fn)] {
      // A TLS write to a closed socket raises SIGPIPE on this thread: keep it pending here
      // rather than let it end the process.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      fn();
      std::lock_guard<std::mutex> lock(state->mutex);
      --server->open_;
      state->done.notify_all();
    }).detach();
  }

  void shutdown() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->done.wait(lock, [this] { return server_.open_.load() == 0; });
  }

 private:
  // Outlives the queue: a finishing thread still unlocks it after the last notify.
  struct State {
    std::mutex mutex;
    std::condition_variable done;
  };
  BoundedHttpServer& server_;
  std::shared_ptr<State> state_;
};

BoundedHttpServer::BoundedHttpServer(ConnectionLimits limits, const std::string& tls_cert,
                                     const std::string& tls_key)
    : limits_(limits) {
  if (tls_cert.empty() != tls_key.empty()) {
    throw std::invalid_argument("TLS needs both a certificate and its private key");
  }
  if (!tls_cert.empty()) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr) throw std::runtime_error("cannot create a TLS context: " + openssl_error());
    tls_ = std::shared_ptr<void>(ctx, [](void* c) { SSL_CTX_free(static_cast<SSL_CTX*>(c)); });
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, tls_cert.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      throw std::runtime_error("cannot use the TLS certificate '" + tls_cert + "' with the key '" +
                               tls_key +
                               "' (unreadable, not PEM, or not a pair: " + openssl_error() + ")");
    }
  }
  new_task_queue = [this] { return new ConnectionThreads(*this); };
}

BoundedHttpServer::~BoundedHttpServer() = default;

int BoundedHttpServer::current_socket() { return t_socket; }

bool BoundedHttpServer::client_gone(int socket) {
  if (socket < 0) return false;
  pollfd p{socket, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void BoundedHttpServer::close_after_response() { t_close_after = true; }

void BoundedHttpServer::refuse(socket_t sock) {
  ++refused_;
  if (!tls_) {
    static const std::string busy = busy_response();
    [[maybe_unused]] const ssize_t sent =
        send(sock, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool BoundedHttpServer::process_and_close_socket(socket_t sock) {
  if (t_refuse) {
    refuse(sock);
    return false;
  }
  const int flags = fcntl(sock, F_GETFL, 0);
  fcntl(sock, F_SETFL, flags | O_NONBLOCK);
  const int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, SSL_free);
  if (tls_) {
    ssl.reset(SSL_new(static_cast<SSL_CTX*>(tls_.get())));
    if (ssl) SSL_set_fd(ssl.get(), sock);
  }
  Connection connection(*this, sock, ssl.get());
  bool open = !tls_ || (ssl && connection.handshake());
  for (int n = 0; open && n < limits_.max_requests_per_connection; ++n) {
    if (!connection.wait_for_request(n == 0 ? limits_.head_timeout : limits_.idle_timeout)) break;
    connection.begin_request();
    bool closed = false;
    t_socket = sock;
    t_close_after = false;
    const bool answered =
        process_request(connection, n + 1 == limits_.max_requests_per_connection, closed, {});
    t_socket = -1;
    open = answered && !closed && !t_close_after;
  }
  if (connection.timed_out()) ++timed_out_;
  if (ssl) {
    ERR_clear_error();
    SSL_shutdown(ssl.get());  // one try: a close_notify if the socket takes it now
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

bool BoundedHttpServer::widen_listen_backlog(int port) {
  // httplib keeps its socket private: find it among this process's descriptors.
  const long max_fd = ::sysconf(_SC_OPEN_MAX);
  for (int fd = 0; fd < (max_fd > 0 ? max_fd : 1024); ++fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) {
      continue;
    }
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) {
      bound = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    }
    if (bound == port) return ::listen(fd, SOMAXCONN) == 0;
  }
  return false;
}

}  // namespace omni::http
