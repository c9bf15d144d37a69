// What the long-running commands (worker, serve, generate through workers) need of their own
// process: its executable (local stage workers are this program run as `vllm-omni worker`) and
// an orderly stop on SIGTERM / SIGINT.
#pragma once

#include <signal.h>

#include <string>

namespace omni::cli {

// This program's path (/proc/self/exe); throws omni::Error when it cannot be read.
std::string self_executable();

// Blocks SIGTERM and SIGINT in the calling thread, so that construct it before any other thread
// exists (gRPC's, LibTorch's): every thread inherits the mask, none dies of the signal, and
// wait() receives it.
class StopSignals {
 public:
  StopSignals();
  // Waits for SIGTERM or SIGINT; returns which.
  int wait();

 private:
  sigset_t signals_;
};

}  // namespace omni::cli
