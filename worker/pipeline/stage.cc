#include "worker/pipeline/stage.h"

#include <utility>

namespace omni::pipeline {

at::Tensor named_tensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return {};
}

at::Tensor StagePacket::tensor(const std::string& name) const {
  return payload ? named_tensor(payload->tensors(), name) : at::Tensor();
}

const char* code_name(StageError::Code code) {
  switch (code) {
    case StageError::Code::kInternal:
      return "internal";
    case StageError::Code::kInvalidArgument:
      return "invalid_argument";
    case StageError::Code::kCancelled:
      return "cancelled";
    case StageError::Code::kDeadlineExceeded:
      return "deadline_exceeded";
    case StageError::Code::kUnavailable:
      return "unavailable";
    case StageError::Code::kResourceExhausted:
      return "resource_exhausted";
  }
  return "internal";
}

void PacketQueue::push(StagePacket packet) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;  // the consumer's error already ended the request
  packets_.push_back(std::move(packet));
  changed_.notify_all();
}

void PacketQueue::close(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  closed_ = true;
  error_ = std::move(error);
  changed_.notify_all();
}

std::optional<StagePacket> PacketQueue::pop(const CancelToken* cancel) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (packets_.empty() && !closed_) {
    // Cancellation is a separate flag: poll it while waiting (a short wait keeps it prompt).
    if (cancel && cancel->cancelled()) {
      throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
  if (!packets_.empty()) {
    StagePacket packet = std::move(packets_.front());
    packets_.pop_front();
    return packet;
  }
  if (error_) std::rethrow_exception(error_);
  return std::nullopt;
}

void PacketQueue::wait_closed(const CancelToken& cancel) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!closed_) {
    if (cancel.cancelled()) {
      throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

bool PacketQueue::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

}  // namespace omni::pipeline
