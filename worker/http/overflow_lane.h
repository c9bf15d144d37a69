// Connections that arrive over the server's caps (all its connections, or one client's share)
// are not refused blind: one thread polls them, reads each request head under a short deadline
// and answers from the head alone, so /health and /metrics still answer while silent or slow
// clients hold every connection (as a reserved health listener would). Everything else gets the
// busy answer. A connection costs a socket and a head buffer here, never a thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/http/http_head.h"

namespace omni::http {

class OverflowLane {
 public:
  // The whole HTTP response (status line to body) for a head read on the lane.
  using Answer = std::function<std::string(const HttpHead& head)>;

  // Holds at most `capacity` connections, `per_client` of them from one address; each is
  // closed `timeout` after it arrived, answered or not.
  OverflowLane(size_t capacity, size_t per_client, std::chrono::milliseconds timeout,
               Answer answer);
  ~OverflowLane();  // stop()
  OverflowLane(const OverflowLane&) = delete;
  OverflowLane& operator=(const OverflowLane&) = delete;

  // Takes `sock` (non-blocking from here on; the lane closes it). False when the lane or the
  // client's share of it is full: the caller still owns the socket.
  bool offer(int sock, const std::string& client);
  // Closes every connection and joins the thread. Idempotent.
  void stop();
  size_t size() const;

 private:
  struct Pending {
    int sock = -1;
    std::string client;
    std::chrono::steady_clock::time_point deadline;
    std::string in, out;  // head bytes read; the answer not yet sent
    size_t sent = 0;
  };
  void loop();
  // Reads what `p` sent; true when it is done with (answered and sent, or closed).
  bool on_readable(Pending& p);
  bool on_writable(Pending& p);
  void close(const Pending& p);

  const size_t capacity_, per_client_;
  const std::chrono::milliseconds timeout_;
  const Answer answer_;
  int wake_[2] = {-1, -1};  // a pipe: offer() and stop() wake the poll

  mutable std::mutex mutex_;
  std::vector<Pending> incoming_;       // offered, not yet polled
  std::map<std::string, size_t> held_;  // connections by client
  size_t size_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace omni::http
