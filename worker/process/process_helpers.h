// What the worker process, its supervisor and the shutdown handler share (worker_process.cc,
// worker_supervisor.cc, shutdown_signals.cc); not an API.
#pragma once

#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

namespace omni::pipeline {

class WorkerProcess;
class WorkerSupervisor;

namespace detail {

// `what`: strerror(errno).
std::runtime_error sys_error(const std::string& what);
// "2 s", "250 ms", "1.5 s".
std::string format_duration(std::chrono::milliseconds duration);
// "SIGTERM", or null for a signal without a name here.
const char* signal_name(int sig);
// "signal 15 (SIGTERM)".
std::string describe_signal(int sig);
// A worker's end as a user reads it: "exited with status 3", "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status);

// Every WorkerProcess and WorkerSupervisor alive, for the shutdown handler.
struct Registry {
  std::mutex mu;
  std::set<WorkerProcess*> processes;
  std::set<WorkerSupervisor*> supervisors;
};
Registry& registry();

}  // namespace detail
}  // namespace omni::pipeline
