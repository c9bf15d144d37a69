// Progress lines while a model's weights are placed: packed into host slabs, streamed to the
// device, or left in the checkpoint for the disk tier. For a large checkpoint that is the
// longest silent stretch of a start (a 70 GB model reads 70 GB from disk before it answers).
//
// A LoadProgress lives on the stack of the thread that places the weights, around
// apply_offload and make_expert_cache. The code that moves weights reports the checkpoint
// bytes it has dealt with through LoadProgress::add(), which counts toward the calling
// thread's innermost LoadProgress and does nothing where there is none: no reporter has to be
// threaded through every unit constructor, and tests and tools that place weights without
// one print nothing. It logs an info line at most every `interval_s` seconds, the first only
// once `interval_s` has passed: a short load prints nothing at all.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace omni::offload {

class LoadProgress {
 public:
  // `what` names the job in the lines ("placing the weights of /models/qwen3-omni");
  // `total_bytes` is what add() will count up to (module_tensor_bytes()).
  LoadProgress(std::string what, uint64_t total_bytes, double interval_s = 5.0);
  // After any progress line, one more with the bytes and the time it took. The bytes count
  // toward the LoadProgress this one was nested in, if any.
  ~LoadProgress();
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  // `bytes` of checkpoint tensors placed, counted toward this thread's LoadProgress (if any).
  static void add(uint64_t bytes);

  uint64_t done_bytes() const { return done_; }
  int lines() const { return lines_; }

 private:
  void report(bool last);

  std::string what_;
  uint64_t total_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point start_, next_;
  uint64_t done_ = 0;
  int lines_ = 0;
  LoadProgress* outer_;  // the thread's LoadProgress before this one
};

// The bytes of `module`'s parameters and buffers as they are now, each storage once (tied
// weights share one): the total to give a LoadProgress before placing them.
uint64_t module_tensor_bytes(torch::nn::Module& module);

}  // namespace omni::offload
