#include "worker/cli/process_control.h"

#include <pthread.h>
#include <unistd.h>

#include <climits>

#include "cpu_offload/check.h"

namespace omni::cli {

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  OMNI_CHECK(n > 0, "cannot find this program's path (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(n));
}

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

int StopSignals::wait() {
  int sig = 0;
  sigwait(&signals_, &sig);
  return sig;
}

}  // namespace omni::cli
