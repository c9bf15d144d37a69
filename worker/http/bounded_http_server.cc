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
#include <vector>

#include "cpu_offload/logging.h"
#include "worker/http/api_error.h"

namespace omni::http {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_socket = -1;
thread_local const std::string* t_client = nullptr;
thread_local bool t_close_after = false;
thread_local bool t_accepting = false;  // on the accepting thread, in ConnectionThreads::enqueue
// What the current request holds until it has been answered (hold_until_answered).
thread_local std::vector<std::shared_ptr<void>> t_held;

// Waits are cut in slices so that a stopping server is noticed.
constexpr auto kWaitSlice = std::chrono::milliseconds(100);

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kWaitSlice.count()));
}

// What a non-blocking read or write asks for next.
constexpr ssize_t kWantRead = -2;
constexpr ssize_t kWantWrite = -3;

// An answer of the connection itself, as OpenAI's error JSON, after which it closes.
std::string plain_response(int status, const std::string& message, const std::string& code) {
  ApiError e;
  e.status = status;
  e.type = status >= 500 ? "server_error" : "invalid_request_error";
  e.message = message;
  e.code = code;
  return raw_http_response(status, "application/json", e.json(),
                           status == 503 ? "Retry-After: 1\r\n" : "");
}

const std::string& busy_response() {
  static const std::string response = plain_response(
      503, "the server has too many open connections: try again later", "too_many_connections");
  return response;
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
// (plain or TLS) whose reads fail once the current phase's deadline has passed. Each request's
// head is read here first (read_head); httplib then reads that head, filtered, and at most the
// body bytes its Content-Length announces.
class BoundedHttpServer::Connection final : public httplib::Stream {
 public:
  enum class Head { kReady, kClosed, kTimedOut, kTooLarge, kMalformed };

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

  // Reads the next request's head within the head deadline. kReady: head() holds it, and what
  // httplib reads next is that head (Range kept only where `keeps_range` says), then the body.
  Head read_head() {
    head_in_.clear();
    head_out_.clear();
    head_pos_ = 0;
    body_left_ = 0;
    body_refused_ = false;
    written_ = 0;
    deadline_ = Clock::now() + limits_.head_timeout;
    for (;;) {
      if (begin_ == end_) {
        const ssize_t n = fill();
        if (n == 0) return head_in_.empty() ? Head::kClosed : Head::kMalformed;
        if (n < 0) return timed_out_ ? Head::kTimedOut : Head::kClosed;
      }
      const size_t searched = head_in_.size() > 3 ? head_in_.size() - 3 : 0;
      const size_t take = std::min(end_ - begin_, limits_.max_head_bytes + 1 - head_in_.size());
      head_in_.append(buffer_ + begin_, take);
      begin_ += take;
      const size_t end = head_end(std::string_view(head_in_).substr(searched));
      if (end != std::string_view::npos) {
        // Bytes past the head are the body's: back into the buffer.
        begin_ -= head_in_.size() - (searched + end);
        head_in_.resize(searched + end);
        break;
      }
      if (head_in_.size() > limits_.max_head_bytes) return Head::kTooLarge;
    }
    // One blank line before a request is tolerated (RFC 9112 2.2): clients send one after a body.
    std::string_view text(head_in_);
    while (!text.empty() && (text.front() == '\r' || text.front() == '\n')) text.remove_prefix(1);
    auto head = parse_http_head(text);
    if (!head) return Head::kMalformed;
    head_ = std::move(*head);
    const BodyFraming framing = body_framing(head_);
    body_left_ = framing.kind == BodyFraming::Kind::kLength ? framing.length : 0;
    body_refused_ =
        framing.kind == BodyFraming::Kind::kChunked || framing.kind == BodyFraming::Kind::kInvalid;
    filter_range();
    head_out_ = head_.serialize();
    deadline_ = Clock::now() + limits_.body_timeout;
    return Head::kReady;
  }

  const HttpHead& head() const { return head_; }
  // Body bytes announced and not read (the handler refused the request from its head).
  bool body_unread() const { return body_left_ > 0 || body_refused_; }
  bool response_started() const { return written_ > 0; }
  bool timed_out() const { return timed_out_; }

  // A short answer of the connection itself (a head it could not take), before it closes.
  void answer(const std::string& response) { write(response.data(), response.size()); }

  // Before closing a connection whose client may still be sending (a body refused from the
  // head): stops sending, then reads and drops the client's bytes up to the linger limits, so
  // that the close does not reset the connection before the client has read the answer.
  void linger() {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      SSL_shutdown(ssl_);
    }
    ::shutdown(sock_, SHUT_WR);
    const auto deadline = Clock::now() + limits_.linger_timeout;
    uint64_t left = limits_.linger_bytes;
    while (left > 0 && wait(POLLIN, deadline, false)) {
      const ssize_t n = recv(sock_, buffer_, sizeof(buffer_), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
      if (n > 0) left -= std::min<uint64_t>(left, static_cast<uint64_t>(n));
    }
    begin_ = end_ = 0;
  }

  bool is_readable() const override {
    return head_pos_ < head_out_.size() || begin_ < end_ || wait(POLLIN, deadline_);
  }
  bool is_writable() const override {
    return wait(POLLOUT, Clock::now() + limits_.write_timeout, false);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (head_pos_ < head_out_.size()) {
      const size_t n = std::min(size, head_out_.size() - head_pos_);
      std::memcpy(ptr, head_out_.data() + head_pos_, n);
      head_pos_ += n;
      return static_cast<ssize_t>(n);
    }
    if (body_refused_) return -1;
    if (body_left_ == 0) return 0;  // the body ends here, whatever the client sends next
    if (begin_ == end_) {
      const ssize_t n = fill();
      if (n <= 0) return n == 0 ? -1 : n;  // closed before the announced length: an error
    }
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>({static_cast<uint64_t>(size), end_ - begin_, body_left_}));
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    body_left_ -= n;
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
      if (n >= 0) {
        written_ += static_cast<uint64_t>(n);
        return n;
      }
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
  // A Range header survives only on the routes that serve ranges, as one small, well-formed
  // list (httplib parses it with std::regex, and builds a copy of the body per range).
  void filter_range() {
    const auto values = head_.values("Range");
    if (values.empty()) return;
    head_.erase("Range");
    if (values.size() != 1 || !server_.keeps_range_ || !server_.keeps_range_(head_)) return;
    const auto ranges = parse_byte_ranges(values.front(), limits_.max_ranges);
    if (!ranges) return;
    std::string canonical = "bytes=";
    for (size_t i = 0; i < ranges->size(); ++i) {
      const ByteRange& r = (*ranges)[i];
      if (i > 0) canonical += ',';
      if (r.first) canonical += std::to_string(*r.first);
      canonical += '-';
      if (r.last) canonical += std::to_string(*r.last);
    }
    head_.headers.emplace_back("Range", canonical);
  }

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
  std::string head_in_, head_out_;
  size_t head_pos_ = 0;
  HttpHead head_;
  uint64_t body_left_ = 0;
  bool body_refused_ = false;  // chunked or ambiguous framing: the body is never read
  uint64_t written_ = 0;       // bytes of the current request's response
  bool timed_out_ = false;
  Clock::time_point deadline_ = Clock::now();
};

// Outlives the server's threads: a connection thread still unlocks it after the last notify.
struct BoundedHttpServer::ConnectionState {
  std::mutex mutex;
  std::condition_variable done;
};

struct BoundedHttpServer::Slot {
  Slot(int s, std::string c) : sock(s), client(std::move(c)) {}
  const int sock;
  const std::string client;
  bool busy = false;     // a request head has been read and the request not yet answered
  bool evicted = false;  // shut down by make_room()
};

namespace {
// Evicted connections whose threads have not ended yet: the pool exceeds its cap by at most this.
constexpr int kMaxEvicting = 32;
}  // namespace

// httplib hands each accepted socket to a task queue; this one runs the hand-off on the
// accepting thread, where admit() gives the socket a thread of its own (bounded by the caps),
// the overflow lane or a 503, so no client waits for a thread another client holds.
class BoundedHttpServer::ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(BoundedHttpServer& server) : server_(server) {}

  void enqueue(std::function<void()> fn) override {
    t_accepting = true;
    fn();  // process_and_close_socket: admit()
    t_accepting = false;
  }

  void shutdown() override {
    if (server_.lane_) server_.lane_->stop();
    std::unique_lock<std::mutex> lock(server_.state_->mutex);
    server_.state_->done.wait(lock, [this] { return server_.open_.load() == 0; });
  }

 private:
  BoundedHttpServer& server_;
};

BoundedHttpServer::BoundedHttpServer(ConnectionLimits limits, const std::string& tls_cert,
                                     const std::string& tls_key)
    : limits_(limits), state_(std::make_shared<ConnectionState>()) {
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
  // The Keep-Alive header httplib writes states these limits.
  set_keep_alive_max_count(static_cast<size_t>(limits_.max_requests_per_connection));
  set_keep_alive_timeout(static_cast<time_t>((limits_.idle_timeout.count() + 999) / 1000));
  new_task_queue = [this] { return new ConnectionThreads(*this); };
}

BoundedHttpServer::~BoundedHttpServer() {
  if (lane_) lane_->stop();
}

void BoundedHttpServer::set_range_routes(std::function<bool(const HttpHead&)> keeps_range) {
  keeps_range_ = std::move(keeps_range);
}

void BoundedHttpServer::set_overflow_answer(OverflowLane::Answer answer) {
  if (tls_ || !answer) return;  // the lane speaks plain HTTP only
  lane_ =
      std::make_unique<OverflowLane>(static_cast<size_t>(limits_.overflow_connections),
                                     static_cast<size_t>(limits_.overflow_connections_per_client),
                                     limits_.overflow_timeout, std::move(answer));
}

int BoundedHttpServer::current_socket() { return t_socket; }

const std::string& BoundedHttpServer::current_client() {
  static const std::string none;
  return t_client != nullptr ? *t_client : none;
}

bool BoundedHttpServer::client_gone(int socket) {
  if (socket < 0) return false;
  pollfd p{socket, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void BoundedHttpServer::close_after_response() { t_close_after = true; }

void BoundedHttpServer::hold_until_answered(std::shared_ptr<void> held) {
  t_held.push_back(std::move(held));
}

void BoundedHttpServer::on_request_head(const HttpHead&) {}

void BoundedHttpServer::refuse(socket_t sock) {
  ++refused_;
  if (!tls_) {
    const std::string& busy = busy_response();
    [[maybe_unused]] const ssize_t sent =
        send(sock, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool BoundedHttpServer::process_and_close_socket(socket_t sock) {
  if (!t_accepting) {  // not through ConnectionThreads: httplib's own callers
    serve(sock, "", nullptr);
    ::close(sock);
    return true;
  }
  admit(sock);
  return true;
}

void BoundedHttpServer::admit(socket_t sock) {
  std::string client;
  int port = 0;
  address_of(sock, true, client, port);
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto it = clients_.find(client);
    const int mine = it == clients_.end() ? 0 : it->second;
    if (mine < limits_.max_connections_per_client) {
      if (open_.load() - evicting_ >= limits_.max_connections) make_room(mine);
      if (open_.load() - evicting_ < limits_.max_connections) {
        ++open_;
        ++clients_[client];
        slot = std::make_shared<Slot>(sock, client);
        slots_.push_back(slot);
      }
    }
  }
  if (!slot) {
    if (lane_ && lane_->offer(sock, client)) {
      ++overflowed_;
    } else {
      refuse(sock);
    }
    return;
  }
  std::thread([this, state = state_, slot] {
    // A TLS write to a closed socket raises SIGPIPE on this thread: keep it pending here
    // rather than let it end the process.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    serve(slot->sock, slot->client, slot.get());
    std::lock_guard<std::mutex> lock(state->mutex);
    // The slot goes before its socket closes: make_room() never shuts down a reused number.
    slots_.remove(slot);
    if (slot->evicted) --evicting_;
    ::close(slot->sock);
    if (--clients_[slot->client] == 0) clients_.erase(slot->client);
    --open_;
    state->done.notify_all();
  }).detach();
}

void BoundedHttpServer::make_room(int mine) {
  if (evicting_ >= kMaxEvicting) return;
  Slot* victim = nullptr;
  int most = mine + 1;
  for (const auto& s : slots_) {
    if (s->busy || s->evicted) continue;
    const int held = clients_[s->client];
    if (held > most) {
      most = held;
      victim = s.get();
    }
  }
  if (victim == nullptr) return;
  victim->evicted = true;
  ++evicting_;
  ++evicted_;
  ::shutdown(victim->sock, SHUT_RDWR);
}

bool BoundedHttpServer::set_busy(Slot* slot, bool busy) {
  if (slot == nullptr) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (slot->evicted) return false;
  slot->busy = busy;
  return true;
}

void BoundedHttpServer::end_request() {
  t_socket = -1;
  t_client = nullptr;
  t_held.clear();  // after the response was written: the request's budget goes back
}

void BoundedHttpServer::failed(Connection& connection, const std::string& client,
                               const char* what) {
  ++failed_;
  static RateLimitedLog log(LogLevel::kWarning);
  log.write("serve: the connection from " + (client.empty() ? std::string("?") : client) +
            " failed and was closed: " + what);
  if (!connection.response_started()) {
    connection.answer(plain_response(
        500, "the server failed while serving this request; it goes on serving others",
        "internal_error"));
  }
}

void BoundedHttpServer::serve(socket_t sock, const std::string& client, Slot* slot) {
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
  bool linger = false;
  for (int n = 0; open && n < limits_.max_requests_per_connection; ++n) {
    if (!set_busy(slot, false)) break;
    if (!connection.wait_for_request(n == 0 ? limits_.head_timeout : limits_.idle_timeout)) break;
    open = false;
    try {
      const Connection::Head read = connection.read_head();
      if (read == Connection::Head::kTooLarge) {
        connection.answer(plain_response(
            431,
            "the request head is larger than " + std::to_string(limits_.max_head_bytes) + " bytes",
            "request_too_large"));
        linger = true;
      } else if (read == Connection::Head::kMalformed) {
        connection.answer(
            plain_response(400, "the request head is not valid HTTP/1.1", "invalid_request"));
        linger = true;
      }
      if (read != Connection::Head::kReady || !set_busy(slot, true)) break;
      on_request_head(connection.head());
      t_socket = sock;
      t_client = &client;
      t_close_after = false;
      bool closed = false;
      const bool answered =
          process_request(connection, n + 1 == limits_.max_requests_per_connection, closed, {});
      end_request();
      // A body the handler did not read cannot be followed by another request.
      linger = connection.body_unread();
      open = answered && !closed && !t_close_after && !linger;
    } catch (const std::exception& e) {
      end_request();
      failed(connection, client, e.what());
      linger = true;
    } catch (...) {
      end_request();
      failed(connection, client, "an unknown exception");
      linger = true;
    }
  }
  if (connection.timed_out()) ++timed_out_;
  if (linger) connection.linger();
  if (ssl) {
    ERR_clear_error();
    SSL_shutdown(ssl.get());  // one try: a close_notify if the socket takes it now
  }
  ::shutdown(sock, SHUT_RDWR);
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
