// Local stage-worker processes for the pipeline orchestrator: start them, learn where they
// listen, notice when one dies, restart it, and stop them all (also on SIGINT/SIGTERM). POSIX and
// the standard library only: no LibTorch, no gRPC.
//
// The start-up protocol. The supervisor runs `argv... --ready-fd 3`: fd 3 of the child is the
// write end of a pipe. Once the child listens (on port 0, so the OS picks a free port and there
// is no race for one) it writes one line `LISTENING <host>:<port>\n` to fd 3 and closes it. A
// child that exits, closes fd 3 without the line, or stays silent past the start-up timeout has
// failed to start; the error names the worker, how it ended and the last lines of its log.
//
// Children never outlive this process: each one is started with PR_SET_PDEATHSIG = SIGKILL. The
// kernel sends that signal when the *thread* that forked the child ends, not the process, so all
// forks happen on one internal thread that lives as long as the process (a worker started from
// a short-lived thread, as start_all's are, would otherwise be killed when that thread returns).
// Children stay in this process's process group, so a Ctrl-C in the terminal reaches them too,
// like any foreground job; a worker must handle SIGINT like SIGTERM (finish or drop in-flight
// work and exit).
//
// Every descriptor but 0, 1, 2 and the ready pipe (3) is closed in the child, whoever opened it
// and with or without O_CLOEXEC: a worker must not keep another component's pipe or socket open.
// The child's signal mask is cleared and its handlers reset, so SIGTERM always reaches it.
//
// No SIGCHLD handler is installed: a child is reaped with waitpid(pid, WNOHANG) on its own pid
// only, so other code of the process may run and wait for children of its own.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace omni::pipeline {

struct WorkerSpec {
  std::string name;               // e.g. "stage 1 (talker)": used in every message
  std::vector<std::string> argv;  // argv[0]: the program (a path, or a name looked up in PATH);
                                  // the supervisor appends "--ready-fd", "3"
  // Variables set in the child's environment over the ones it inherits: a secret for the worker
  // goes here, never in argv (anyone can read a command line; an environment only its user).
  std::vector<std::pair<std::string, std::string>> env;
  std::chrono::milliseconds startup_timeout{60000};
  // The child's stdout and stderr are appended to this file (created if needed). Empty: both go
  // to this process's stderr (stdout too, so that a worker never writes into our stdout).
  std::string log_path;
};

// One child process. Thread-safe: running(), exit_status(), pid(), address(), stop() and
// kill_now() may be called from any thread, also while another thread is in start().
class WorkerProcess {
 public:
  explicit WorkerProcess(WorkerSpec spec);
  ~WorkerProcess();  // stop()
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Spawns the child and waits for its ready line; returns its "host:port". Throws
  // std::runtime_error naming the worker: "stage 1 (talker) did not come up within 60 s",
  // "... exited with status 3 before it was ready", "... was killed by signal 9 (SIGKILL) before
  // it was ready", "... was stopped before it was ready" (stop() from another thread), each
  // followed by the last lines of its log; "could not run <program>: <reason>". On every failure
  // the child is gone (killed and reaped). A worker that has exited may be started again;
  // starting one that is running throws.
  std::string start();

  bool running() const;                    // the child is alive (reaps it once it is not)
  std::optional<int> exit_status() const;  // once exited: its status, or 128 + signal
  pid_t pid() const;                       // the last child's pid (also after it exited), or -1
  std::string address() const;             // the last ready address, "" before the first
  const WorkerSpec& spec() const { return spec_; }

  // SIGTERM, up to `grace` for the child to exit, then SIGKILL; returns once it is reaped.
  // Idempotent; does nothing when no child runs. Aborts a start() in progress on another thread.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));
  void kill_now();  // SIGKILL and reap

 private:
  friend class WorkerSupervisor;
  std::string start_impl(const std::atomic<bool>* cancel);
  bool live_locked() const;  // not yet reaped; reaps it (WNOHANG) when it has exited
  bool wait_exit(std::chrono::steady_clock::time_point deadline) const;
  std::string exit_description() const;  // "exited with status 3", "was killed by signal 9 ..."

  const WorkerSpec spec_;
  const std::string name_;  // spec_.name, or argv[0] when it is empty
  mutable std::mutex mu_;
  pid_t pid_ = -1;
  mutable bool reaped_ = true;
  mutable int raw_status_ = 0;  // waitpid's status; -1: collected by other code
  std::string address_;
  bool starting_ = false;
  uint64_t stop_epoch_ = 0;  // bumped by stop(): a start() that sees it change aborts
};

// Owns several workers. One watcher thread per worker starts it, then polls it every
// `poll_interval`; when it died, the watcher calls on_exit, restarts it with the same spec and
// calls on_restarted or, once it gives up, on_restart_failed. All callbacks for worker i come
// from its watcher, in order, with no lock held; they must not call stop_all().
class WorkerSupervisor {
 public:
  struct Options {
    // Restarts in a row before giving up. A worker that stayed up for `healthy_after` since its
    // last (re)start has its count reset, so a rare crash never exhausts it.
    int max_restarts = 5;
    std::chrono::milliseconds poll_interval{100};
    std::chrono::milliseconds healthy_after{60000};
  };

  WorkerSupervisor();
  explicit WorkerSupervisor(Options options);
  ~WorkerSupervisor();  // stop_all()
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  // Starts all workers in parallel (the total start-up is the slowest one's, not the sum) and
  // returns their addresses in order. When one fails, the others are stopped at once (not left
  // to finish their own start-up) and its error is thrown. Throws std::logic_error while workers
  // of an earlier start_all are still managed (call stop_all first).
  std::vector<std::string> start_all(std::vector<WorkerSpec> specs);

  std::string address(size_t index) const;  // the last ready address
  uint64_t generation(size_t index) const;  // 1 after start_all, +1 on each restart
  pid_t pid(size_t index) const;
  size_t size() const;

  // on_exit(index, status): worker `index` died (status, or 128 + signal). on_restarted(index,
  // address): it is up again. on_restart_failed(index, message): the supervisor gave up on it
  // (max_restarts failed or short-lived restarts in a row); it stays down. Set before start_all
  // or at any time.
  void set_callbacks(std::function<void(size_t, int)> on_exit,
                     std::function<void(size_t, const std::string&)> on_restarted,
                     std::function<void(size_t, const std::string&)> on_restart_failed);

  // Blocks until worker `index` is up with generation >= min_generation and returns its address.
  // Throws when the supervisor gave up on it, when it is stopped, or after `timeout`. A worker
  // that died but was not yet noticed is not "up": after a crash the call waits for the restart.
  // To wait for the restart after a crash you caused yourself, pass generation(index) + 1.
  std::string wait_ready(size_t index, std::chrono::milliseconds timeout,
                         uint64_t min_generation = 0);

  // Stops every worker in parallel (SIGTERM, `grace`, SIGKILL) and its watcher; no restarts
  // after it begins. Idempotent; thread-safe.
  void stop_all(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

 private:
  struct Slot;
  void watch(size_t index, const std::shared_ptr<Slot>& slot);
  std::shared_ptr<Slot> slot_locked(size_t index) const;

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Slot>> slots_;
  bool stopping_ = false;
  size_t first_failure_ = 0;  // with failed_: the worker whose start failed first
  bool failed_ = false;
  std::atomic<bool> cancel_{false};  // stopping_, for WorkerProcess::start_impl to poll
  std::function<void(size_t, int)> on_exit_;
  std::function<void(size_t, const std::string&)> on_restarted_;
  std::function<void(size_t, const std::string&)> on_restart_failed_;
};

// Process-wide, installed once (later calls do nothing): on SIGINT or SIGTERM, stop every
// WorkerSupervisor and WorkerProcess that exists (SIGTERM to the children, SIGKILL after
// `grace`), then exit with 128 + signal (130 / 143). The handler only writes the signal number
// to a pipe; a dedicated thread does the work. A second signal during the shutdown exits at once
// (the children then get SIGKILL from PR_SET_PDEATHSIG). Returns immediately.
void install_shutdown_handler(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

}  // namespace omni::pipeline
