#include "worker/http/overflow_lane.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

namespace omni::http {
namespace {

using Clock = std::chrono::steady_clock;

// A health probe's head is a few hundred bytes; a head that does not fit is not one.
constexpr size_t kMaxHead = 8192;

const std::string& malformed_answer() {
  static const std::string answer =
      "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  return answer;
}

}  // namespace

OverflowLane::OverflowLane(size_t capacity, size_t per_client, std::chrono::milliseconds timeout,
                           Answer answer)
    : capacity_(capacity), per_client_(per_client), timeout_(timeout), answer_(std::move(answer)) {
  if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    throw std::runtime_error("cannot make the overflow lane's wake-up pipe");
  }
  thread_ = std::thread([this] { loop(); });
}

OverflowLane::~OverflowLane() {
  stop();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

bool OverflowLane::offer(int sock, const std::string& client) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto held = held_.find(client);
    if (stopping_ || size_ >= capacity_ || (held != held_.end() && held->second >= per_client_)) {
      return false;
    }
    ++size_;
    ++held_[client];
    const int flags = fcntl(sock, F_GETFL, 0);
    fcntl(sock, F_SETFL, flags | O_NONBLOCK);
    Pending p;
    p.sock = sock;
    p.client = client;
    p.deadline = Clock::now() + timeout_;
    incoming_.push_back(std::move(p));
  }
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_[1], &byte, 1);
  return true;
}

void OverflowLane::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
}

size_t OverflowLane::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

void OverflowLane::close(const Pending& p) {
  ::shutdown(p.sock, SHUT_RDWR);
  ::close(p.sock);
  std::lock_guard<std::mutex> lock(mutex_);
  --size_;
  if (--held_[p.client] == 0) held_.erase(p.client);
}

bool OverflowLane::on_readable(Pending& p) {
  char buffer[4096];
  const ssize_t n = ::recv(p.sock, buffer, sizeof(buffer), MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  if (n < 0) return false;
  const size_t searched = p.in.size() > 3 ? p.in.size() - 3 : 0;
  p.in.append(buffer, static_cast<size_t>(n));
  const size_t end = head_end(std::string_view(p.in).substr(searched));
  if (end == std::string_view::npos) {
    if (p.in.size() <= kMaxHead) return false;
    p.out = malformed_answer();
  } else {
    const auto head = parse_http_head(std::string_view(p.in).substr(0, searched + end));
    p.out = head ? answer_(*head) : malformed_answer();
  }
  p.in.clear();
  p.in.shrink_to_fit();
  return on_writable(p);
}

bool OverflowLane::on_writable(Pending& p) {
  while (p.sent < p.out.size()) {
    const ssize_t n =
        ::send(p.sock, p.out.data() + p.sent, p.out.size() - p.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    p.sent += static_cast<size_t>(n);
  }
  return true;
}

void OverflowLane::loop() {
  std::vector<Pending> open;
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
      for (auto& p : incoming_) open.push_back(std::move(p));
      incoming_.clear();
    }
    const auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    for (const auto& p : open) {
      fds.push_back(pollfd{p.sock, static_cast<short>(p.out.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, p.deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    if (ready < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof(drain)) > 0) {
      }
    }
    const auto after = Clock::now();
    std::vector<Pending> still;
    for (size_t i = 0; i < open.size(); ++i) {
      Pending& p = open[i];
      const short events = fds[i + 1].revents;
      bool done = after >= p.deadline;
      if (!done && (events & (POLLERR | POLLNVAL)) != 0) done = true;
      if (!done && (events & (POLLIN | POLLHUP)) != 0 && p.out.empty()) done = on_readable(p);
      if (!done && (events & POLLOUT) != 0) done = on_writable(p);
      if (done) {
        close(p);
      } else {
        still.push_back(std::move(p));
      }
    }
    open.swap(still);
  }
  for (const auto& p : open) close(p);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& p : incoming_) {
    ::shutdown(p.sock, SHUT_RDWR);
    ::close(p.sock);
  }
  size_ -= incoming_.size();
  incoming_.clear();
  held_.clear();
}

}  // namespace omni::http
