// Milliseconds since a steady-clock time point: the timing helper the stages, the HTTP server
// and the command line share.
#pragma once

#include <chrono>

namespace omni::pipeline {

inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace omni::pipeline
