// One model call at a time across a stage's concurrent requests: the stage's lock, and the
// offload backend's forward scope for the call (its weights on the device while it runs).
#pragma once

#include <functional>
#include <mutex>

#include "cpu_offload/offload_backend.h"

namespace omni::models {

inline void run_exclusive(std::mutex& model_mutex, offload::OffloadBackend& backend,
                          const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(model_mutex);
  auto forward = backend.forward_scope();
  fn();
}

}  // namespace omni::models
