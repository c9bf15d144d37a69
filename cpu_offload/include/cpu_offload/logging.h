// Minimal leveled logging to stderr. The level comes from OMNI_LOG_LEVEL
// (debug, info, warning, error; default info) or set_log_level().
#pragma once

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

}  // namespace omni
