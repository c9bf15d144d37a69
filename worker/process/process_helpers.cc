#include "worker/process/process_helpers.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace omni::pipeline::detail {

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

std::string format_duration(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  if (ms < 1000) return std::to_string(ms) + " ms";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

const char* signal_name(int sig) {
  static const std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}};
  for (const auto& [number, name] : kNames) {
    if (number == sig) return name;
  }
  return nullptr;
}

std::string describe_signal(int sig) {
  const char* name = signal_name(sig);
  return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
}

Registry& registry() {
  static Registry* instance = new Registry();  // outlives every static destructor
  return *instance;
}

std::string describe_status(int status) {
  if (status < 0) return "exited (its status was collected by other code)";
  if (status > 128) return "was killed by " + describe_signal(status - 128);
  return "exited with status " + std::to_string(status);
}

}  // namespace omni::pipeline::detail
