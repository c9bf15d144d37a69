// Minimal leveled logging to stderr. The level comes from OMNI_LOG_LEVEL
// (debug, info, warning, error; default info) or set_log_level().
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "cpu_offload/check.h"

namespace omni {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

template <typename... Parts>
void log_debug(const Parts&... parts) {
  if (log_level() <= LogLevel::kDebug) log_message(LogLevel::kDebug, detail::str_cat(parts...));
}
template <typename... Parts>
void log_info(const Parts&... parts) {
  if (log_level() <= LogLevel::kInfo) log_message(LogLevel::kInfo, detail::str_cat(parts...));
}
template <typename... Parts>
void log_warning(const Parts&... parts) {
  if (log_level() <= LogLevel::kWarning) {
    log_message(LogLevel::kWarning, detail::str_cat(parts...));
  }
}

// Lines that a client can cause (a refused call, a failed connection), written at a bounded
// rate so that a client in a loop cannot fill the log: at most `burst` lines per `window`; the
// lines beyond are counted, and the count is written with the first line of a later window.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(LogLevel level,
                          std::chrono::milliseconds window = std::chrono::seconds(10),
                          int burst = 10);
  void write(const std::string& message);

 private:
  std::mutex mutex_;
  const LogLevel level_;
  const std::chrono::milliseconds window_;
  const int burst_;
  std::chrono::steady_clock::time_point window_start_{};
  int written_ = 0;
  uint64_t unwritten_ = 0;
};

}  // namespace omni
