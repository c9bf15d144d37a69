// SIGINT / SIGTERM stop every worker this process started, then end the process.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/process/process_helpers.h"
#include "worker/process/worker_process.h"

namespace omni::pipeline {
namespace {

using detail::registry;
using detail::signal_name;
using detail::sys_error;
using std::chrono::milliseconds;

std::atomic<int> g_signal_pipe{-1};
std::atomic<bool> g_signalled{false};

void on_shutdown_signal(int sig) {
  const int saved_errno = errno;
  if (g_signalled.exchange(true)) ::_exit(128 + sig);  // the second signal: at once
  const unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe.load(), &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

void stop_everything(milliseconds grace) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);  // held to the end: no object goes away meanwhile
  std::vector<std::thread> stoppers;
  for (WorkerSupervisor* supervisor : reg.supervisors) {
    stoppers.emplace_back([supervisor, grace] { supervisor->stop_all(grace); });
  }
  for (WorkerProcess* process : reg.processes) {
    stoppers.emplace_back([process, grace] { process->stop(grace); });
  }
  for (auto& stopper : stoppers) stopper.join();
}

void shutdown_thread(int read_fd, milliseconds grace) {
  unsigned char sig = 0;
  for (;;) {
    const ssize_t n = ::read(read_fd, &sig, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    return;
  }
  const char* name = signal_name(sig);
  std::fprintf(stderr, "%s: stopping the workers\n", name ? name : "signal");
  // The stopping runs on its own thread so that a stuck part cannot keep the process alive.
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([done, grace] {
    stop_everything(grace);
    done->set_value();
  }).detach();
  finished.wait_for(grace + std::chrono::seconds(5));
  std::fflush(nullptr);
  ::_exit(128 + sig);
}

}  // namespace

void install_shutdown_handler(milliseconds grace) {
  static std::once_flag once;
  std::call_once(once, [grace] {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw sys_error("install_shutdown_handler: pipe2");
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // the handler never blocks
    g_signal_pipe = fds[1];
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::thread(shutdown_thread, fds[0], grace).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    struct sigaction action {};
    action.sa_handler = on_shutdown_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
  });
}

}  // namespace omni::pipeline
