#include "worker/http/sse_queue.h"

#include <utility>

namespace omni::http {

void SseQueue::push(std::string event) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({std::move(event), false, false});
  changed_.notify_all();
}

void SseQueue::push_text(const std::string& text, bool first) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!entries_.empty() && entries_.back().is_text) {
    entries_.back().content += text;
  } else {
    entries_.push_back({text, true, first});
  }
  changed_.notify_all();
}

void SseQueue::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = true;
  changed_.notify_all();
}

void SseQueue::client_left() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) client_gone_ = true;
}

bool SseQueue::gone() {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_gone_;
}

SseQueue::Taken SseQueue::take(std::chrono::milliseconds wait) {
  std::deque<Entry> taken;
  Taken out;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, wait, [&] { return !entries_.empty() || done_; });
    taken.swap(entries_);
    out.done = done_;
  }
  for (auto& entry : taken) {
    out.events +=
        entry.is_text ? text_event_(entry.content, entry.first) : std::move(entry.content);
  }
  return out;
}

}  // namespace omni::http
