#include "cpu_offload/logging.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>

namespace omni {
namespace {
LogLevel level_from_env() {
  const char* env = std::getenv("OMNI_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  const std::string value(env);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warning" || value == "warn") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}
}  // namespace

void set_log_level(LogLevel level) { level_storage() = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }

void log_message(LogLevel level, const std::string& message) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::cerr << "[omni " << level_name(level) << "] " << message << std::endl;
}

RateLimitedLog::RateLimitedLog(LogLevel level, std::chrono::milliseconds window, int burst)
    : level_(level), window_(window), burst_(burst) {}

void RateLimitedLog::write(const std::string& message) {
  if (log_level() > level_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= window_) {
    if (unwritten_ > 0) {
      log_message(level_,
                  std::to_string(unwritten_) + " more lines of this kind were left out of the log");
    }
    window_start_ = now;
    written_ = 0;
    unwritten_ = 0;
  }
  if (written_ >= burst_) {
    ++unwritten_;
    return;
  }
  ++written_;
  log_message(level_, message);
}

}  // namespace omni
