// The events of one streamed answer, from the pipeline's threads to the HTTP thread that writes
// them. Text that arrives before the HTTP thread has taken the text ahead of it joins that text:
// a client (or network) slower than the tokens gets one delta holding all of them instead of a
// growing backlog of one-token events, as vLLM's output collector does. The HTTP thread takes
// everything pending at once and sends it in one write.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace omni::http {

class SseQueue {
 public:
  // Makes the SSE event of a text delta; `first`: the answer's first chunk.
  using TextEvent = std::function<std::string(const std::string& text, bool first)>;
  // A client that leaves more than `max_unsent_bytes` unread is dropped (client_left()): the
  // queue never holds more for it.
  explicit SseQueue(TextEvent text_event, size_t max_unsent_bytes = SIZE_MAX)
      : text_event_(std::move(text_event)), max_unsent_bytes_(max_unsent_bytes) {}

  void push(std::string event);                         // a finished SSE event
  void push_text(const std::string& text, bool first);  // a text delta
  void finish();                                        // nothing follows
  // The client left (or the write failed) before the answer was complete.
  void client_left();
  bool gone();

  struct Taken {
    std::string events;  // every pending event, in order
    bool done = false;   // and the answer is complete
  };
  // Waits up to `wait` for an event or the end, then takes what is pending.
  Taken take(std::chrono::milliseconds wait);

 private:
  struct Entry {
    std::string content;  // an SSE event, or (is_text) text not yet made into one
    bool is_text = false;
    bool first = false;
  };
  // Under mutex_: drops the client when `more` bytes would pass the bound.
  bool room_for(size_t more);

  TextEvent text_event_;
  const size_t max_unsent_bytes_;
  size_t unsent_bytes_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Entry> entries_;
  bool done_ = false;
  bool client_gone_ = false;
};

}  // namespace omni::http
