// BoundedHttpServer's connection loop on raw sockets (worker/http/bounded_http_server.h): a
// fault inside the loop closes that connection only (a 500 when nothing was sent, one log line)
// and the server serves the next; bodies are exactly their Content-Length; Range reaches only
// the routes that serve it; a client's connections are capped and the surplus answered from its
// head on the overflow lane; a full pool makes room for a client that holds fewer by closing
// an idle connection of the one that holds the most; a refused body is drained so its client reads
// the answer; the Keep-Alive header states the real limits. Also in the ThreadSanitizer build.
#include "worker/http/bounded_http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace omni::http {
namespace {

using std::chrono::milliseconds;

// The test's server: /ok answers "ok", /slow the same after 1.5 s, /echo the body, /file 100
// bytes (ranges served); a head for /boom makes the connection loop throw.
class TestServer : public BoundedHttpServer {
 public:
  explicit TestServer(ConnectionLimits limits) : BoundedHttpServer(limits) {
    Get("/ok", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(milliseconds(1500));
      res.set_content("ok", "text/plain");
    });
    Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("[" + req.body + "]", "text/plain");
    });
    Delete("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("[" + req.body + "]", "text/plain");
    });
    Get("/file", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(file(), "application/octet-stream");
    });
    Get("/page", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(file(), "text/plain");
    });
    set_range_routes([](const HttpHead& head) { return head.path() == "/file"; });
    set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (req.path != "/refuse") return HandlerResponse::Unhandled;
      res.status = 401;
      res.set_content("no", "text/plain");
      return HandlerResponse::Handled;
    });
  }
  ~TestServer() override { stop_serving(); }

  static std::string file() {
    std::string f;
    for (int i = 0; i < 100; ++i) f += static_cast<char>('a' + i % 26);
    return f;
  }

  int start() {
    const int port = bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { listen_after_bind(); });
    while (!is_running()) std::this_thread::sleep_for(milliseconds(1));
    return port;
  }
  void stop_serving() {
    stop();
    if (thread_.joinable()) thread_.join();
  }

  std::atomic<int> faults{0};

 protected:
  void on_request_head(const HttpHead& head) override {
    if (head.path() == "/boom") {
      ++faults;
      throw std::bad_alloc();
    }
    if (head.path() == "/boom-unknown") throw 42;
  }

 private:
  std::thread thread_;
};

int connect_from(int port, const char* source = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (source != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, source, &local.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// What arrives until the server closes (or `wait` passes without a byte).
std::string read_until_close(int fd, milliseconds wait = milliseconds(5000)) {
  std::string out;
  char buffer[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

std::string roundtrip(int port, const std::string& request, const char* source = nullptr) {
  const int fd = connect_from(port, source);
  send_all(fd, request);
  std::string out = read_until_close(fd);
  ::close(fd);
  return out;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(BoundedHttpServer, AFaultInTheLoopClosesThatConnectionAndTheServerGoesOn) {
  TestServer server{ConnectionLimits{}};
  const int port = server.start();
  testing::internal::CaptureStderr();
  const std::string failed = roundtrip(port, "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string unknown = roundtrip(port, "GET /boom-unknown HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string next =
      roundtrip(port, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(failed.rfind("HTTP/1.1 500 ", 0), 0u) << failed;
  EXPECT_NE(failed.find(R"("code":"internal_error")"), std::string::npos) << failed;
  EXPECT_NE(failed.find("Connection: close"), std::string::npos) << failed;
  EXPECT_EQ(unknown.rfind("HTTP/1.1 500 ", 0), 0u) << unknown;
  EXPECT_EQ(next.rfind("HTTP/1.1 200 ", 0), 0u) << next;
  EXPECT_EQ(server.faults, 1);
  EXPECT_EQ(server.failed_connections(), 2u);
  // One line each, naming the cause.
  EXPECT_EQ(count(log, "failed and was closed"), 2) << log;
  EXPECT_EQ(count(log, "std::bad_alloc"), 1) << log;
}

TEST(BoundedHttpServer, FaultLinesAreRateLimited) {
  TestServer server{ConnectionLimits{}};
  const int port = server.start();
  testing::internal::CaptureStderr();
  for (int i = 0; i < 30; ++i) roundtrip(port, "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(server.faults, 30);
  // The log's burst of 10 per window (possibly joined by earlier tests' lines in the window).
  EXPECT_LE(count(log, "failed and was closed"), 10) << log;
  EXPECT_EQ(roundtrip(port, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 200 ", 0),
            0u);
}

TEST(BoundedHttpServer, ABodyIsExactlyItsContentLengthAndNoneWithoutOne) {
  TestServer server{ConnectionLimits{}};
  const int port = server.start();
  // Two pipelined requests: the first body ends where its length says.
  const std::string two =
      roundtrip(port,
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
                "helloGET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(two.find("[hello]"), std::string::npos) << two;
  EXPECT_EQ(count(two, "HTTP/1.1 200 "), 2) << two;
  // A DELETE without a length has no body: answered at once, although bytes follow that the
  // client never ends.
  const int fd = connect_from(port);
  send_all(fd, "DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  send_all(fd, "more bytes that are not a body");
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "no answer: the server waits for a body";
  // The head and the body may arrive in separate reads (the server writes them apart).
  std::string answer;
  char buffer[4096];
  while (answer.find("\r\n\r\n[]") == std::string::npos && ::poll(&p, 1, 5000) == 1) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_NE(answer.find("\r\n\r\n[]"), std::string::npos) << answer;
  ::close(fd);
}

TEST(BoundedHttpServer, RangesReachOnlyTheRoutesThatServeThem) {
  TestServer server{ConnectionLimits{}};
  const int port = server.start();
  const std::string file = TestServer::file();
  const std::string part = roundtrip(port,
                                     "GET /file HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n"
                                     "Connection: close\r\n\r\n");
  EXPECT_EQ(part.rfind("HTTP/1.1 206 ", 0), 0u) << part;
  EXPECT_EQ(part.substr(part.size() - 10), file.substr(0, 10));
  const std::string page = roundtrip(port,
                                     "GET /page HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n"
                                     "Connection: close\r\n\r\n");
  EXPECT_EQ(page.rfind("HTTP/1.1 200 ", 0), 0u) << page;
  EXPECT_EQ(page.substr(page.size() - 100), file);
  // More ranges than max_ranges: the whole file, once.
  std::string many = "bytes=0-0";
  for (int i = 1; i < 2000; ++i)
    many += "," + std::to_string(i % 100) + "-" + std::to_string(i % 100);
  const std::string whole = roundtrip(
      port, "GET /file HTTP/1.1\r\nHost: x\r\nRange: " + many + "\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(whole.rfind("HTTP/1.1 200 ", 0), 0u) << whole.substr(0, 200);
  EXPECT_LT(whole.size(), 400u);
}

TEST(BoundedHttpServer, AClientOverItsShareIsAnsweredFromItsHeadOthersAreServed) {
  ConnectionLimits limits;
  limits.max_connections_per_client = 2;
  limits.overflow_timeout = milliseconds(3000);
  TestServer server{limits};
  server.set_overflow_answer([](const HttpHead& head) {
    return raw_http_response(head.path() == "/health" ? 200 : 503, "text/plain", "lane");
  });
  const int port = server.start();
  std::vector<int> held = {connect_from(port, "127.0.0.2"), connect_from(port, "127.0.0.2")};
  while (server.open_connections() < 2) std::this_thread::sleep_for(milliseconds(1));
  const std::string health =
      roundtrip(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "127.0.0.2");
  EXPECT_EQ(health.rfind("HTTP/1.1 200 ", 0), 0u) << health;
  EXPECT_NE(health.find("lane"), std::string::npos) << health;
  const std::string busy = roundtrip(port, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "127.0.0.2");
  EXPECT_EQ(busy.rfind("HTTP/1.1 503 ", 0), 0u) << busy;
  // Another address is served as usual.
  const std::string other =
      roundtrip(port, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "127.0.0.3");
  EXPECT_EQ(other.rfind("HTTP/1.1 200 ", 0), 0u) << other;
  EXPECT_GE(server.overflowed_connections(), 2u);
  for (const int fd : held) ::close(fd);
}

// Silent connections from one address fill the pool: a client of another address still gets
// its answer, in place of the attacker's oldest idle connection. A client that holds as many as
// the others does not evict, and a running request is never the one closed.
TEST(BoundedHttpServer, AFullPoolMakesRoomForAClientThatHoldsFewer) {
  ConnectionLimits limits;
  limits.max_connections = 4;
  TestServer server{limits};
  const int port = server.start();
  const auto wait_open = [&](int n) {
    while (server.open_connections() != n) std::this_thread::sleep_for(milliseconds(1));
  };
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(connect_from(port, "127.0.0.2"));
  wait_open(4);
  const std::string ok = "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string served = roundtrip(port, ok, "127.0.0.3");
  EXPECT_EQ(served.rfind("HTTP/1.1 200 ", 0), 0u) << served;
  EXPECT_EQ(server.evicted_connections(), 1u);
  // The oldest of the silent ones was closed, without an answer.
  EXPECT_EQ(read_until_close(silent[0], milliseconds(2000)), "");
  pollfd p{silent[0], POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1) << "the oldest silent connection is still open";
  for (size_t i = 1; i < silent.size(); ++i) {
    pollfd q{silent[i], POLLIN, 0};
    EXPECT_EQ(::poll(&q, 1, 0), 0) << "silent connection " << i << " was closed too";
  }
  for (const int fd : silent) ::close(fd);
  wait_open(0);

  // Two and two: neither holds more than the other's next connection would, so nobody is closed.
  std::vector<int> held = {connect_from(port, "127.0.0.2"), connect_from(port, "127.0.0.2"),
                           connect_from(port, "127.0.0.3"), connect_from(port, "127.0.0.3")};
  wait_open(4);
  const std::string busy = roundtrip(port, ok, "127.0.0.3");
  EXPECT_EQ(busy.rfind("HTTP/1.1 503 ", 0), 0u) << busy;
  EXPECT_EQ(server.evicted_connections(), 1u);
  for (const int fd : held) ::close(fd);
  wait_open(0);

  // Four running requests: none is idle, so none is closed for a newcomer.
  std::vector<std::thread> running;
  std::vector<std::string> answers(4);
  for (size_t i = 0; i < answers.size(); ++i) {
    running.emplace_back([&, i] {
      answers[i] = roundtrip(port, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                             "127.0.0.2");
    });
  }
  wait_open(4);
  std::this_thread::sleep_for(milliseconds(200));  // their heads have been read
  const std::string refused = roundtrip(port, ok, "127.0.0.3");
  EXPECT_EQ(refused.rfind("HTTP/1.1 503 ", 0), 0u) << refused;
  for (auto& t : running) t.join();
  for (const auto& a : answers) EXPECT_EQ(a.rfind("HTTP/1.1 200 ", 0), 0u) << a;
  EXPECT_EQ(server.evicted_connections(), 1u);
}

TEST(BoundedHttpServer, ARefusedBodyIsDrainedSoItsClientReadsTheAnswer) {
  TestServer server{ConnectionLimits{}};
  const int port = server.start();
  const int fd = connect_from(port);
  const std::string body(2 << 20, 'x');
  send_all(fd, "POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n");
  send_all(fd, body);  // the server answered from the head; it reads and drops this
  const std::string answer = read_until_close(fd);
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 401 ", 0), 0u) << answer;
  EXPECT_EQ(answer.substr(answer.size() - 2), "no");
}

TEST(BoundedHttpServer, TheKeepAliveHeaderStatesTheRealLimits) {
  ConnectionLimits limits;
  limits.idle_timeout = milliseconds(7000);
  limits.max_requests_per_connection = 42;
  TestServer server{limits};
  const int port = server.start();
  const int fd = connect_from(port);
  send_all(fd, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
  char buffer[4096];
  const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buffer, static_cast<size_t>(n)).find("Keep-Alive: timeout=7, max=42"),
            std::string::npos);
}

}  // namespace
}  // namespace omni::http
