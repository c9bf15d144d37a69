#include "worker/http/sse_queue.h"

#include <algorithm>
#include <utility>

namespace omni::http {

bool SseQueue::room_for(size_t more) {
  if (client_gone_) return false;
  if (more > max_unsent_bytes_ - std::min(unsent_bytes_, max_unsent_bytes_)) {
    client_gone_ = true;  // too slow a reader: the callbacks cancel the request
    entries_.clear();
    unsent_bytes_ = 0;
    changed_.notify_all();
    return false;
  }
  unsent_bytes_ += more;
  return true;
}

void SseQueue::push(std::string event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_ && !room_for(event.size())) return;
  entries_.push_back({std::move(event), false, false});
  changed_.notify_all();
}

void SseQueue::push_text(const std::string& text, bool first) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!room_for(text.size())) return;
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
    unsent_bytes_ = 0;
    out.done = done_;
  }
  for (auto& entry : taken) {
    out.events +=
        entry.is_text ? text_event_(entry.content, entry.first) : std::move(entry.content);
  }
  return out;
}

}  // namespace omni::http
