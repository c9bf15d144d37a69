#include "worker/process/worker_process.h"

#include "worker/process/process_helpers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <set>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

namespace omni::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using detail::describe_signal;
using detail::describe_status;
using detail::format_duration;
using detail::registry;
using detail::sys_error;
using std::chrono::milliseconds;

constexpr int kReadyFd = 3;         // the child's end of the ready pipe
constexpr int kExecErrorFd = 4;     // the child's end of the exec-error pipe (close-on-exec)
constexpr int kFirstParentFd = 10;  // descriptors handed to the child are moved at or above this
constexpr size_t kLogTailLines = 20;
constexpr size_t kMaxReadyLine = 4096;

std::string errno_text(int error) { return std::strerror(error); }

// The last `max_lines` lines of what was appended to the log since byte `from` (the size of the
// file when the child started: earlier runs' lines are not this run's), each indented.
std::string read_log_tail(const std::string& path, off_t from, size_t max_lines) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string text;
  off_t begin = from;
  if (::fstat(fd, &st) == 0 && st.st_size > from) {
    begin = std::max<off_t>(from, st.st_size - 64 * 1024);
    text.resize(static_cast<size_t>(st.st_size - begin));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n =
          ::pread(fd, text.data() + done, text.size() - done, begin + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (begin > from) {  // started in the middle of a line
    const size_t eol = text.find('\n');
    text.erase(0, eol == std::string::npos ? text.size() : eol + 1);
  }
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    pos = eol + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  const size_t first = lines.size() > max_lines ? lines.size() - max_lines : 0;
  std::string tail;
  for (size_t i = first; i < lines.size(); ++i) {
    tail += (i == first ? "  " : "\n  ") + lines[i];
  }
  return tail;
}

// argv[0] as execve needs it: a name without a slash is looked up in PATH here, before the fork,
// since the child may only make async-signal-safe calls.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t end = dirs.find(':', pos);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > pos ? dirs.substr(pos, end - pos) : ".";
    std::string candidate = dir;
    candidate += "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    pos = end + 1;
  }
  return program;  // execve fails with ENOENT, which start() reports
}

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Moves the descriptor to a number >= kFirstParentFd (close-on-exec), so that the child's
  // dup2 onto 0..4 never overwrites a descriptor it still has to copy.
  void raise() {
    if (fd_ < 0 || fd_ >= kFirstParentFd) return;
    const int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, kFirstParentFd);
    if (fd < 0) throw sys_error("fcntl(F_DUPFD_CLOEXEC)");
    reset(fd);
  }

 private:
  int fd_ = -1;
};

// What the child does between fork and exec, prepared by the parent: after the fork only
// async-signal-safe calls on this data.
struct ChildPlan {
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int stdin_fd = -1;  // /dev/null
  int log_fd = -1;    // -1: stdout and stderr go to our stderr
  int ready_fd = -1;  // write end of the ready pipe: becomes fd 3
  int error_fd = -1;  // write end of the exec-error pipe: becomes fd 4 (close-on-exec)
  pid_t parent = -1;
  int max_fd = 0;  // for closing descriptors where close_range is missing
};

[[noreturn]] void child_fail(int fd, int step) {
  const int report[2] = {step, errno};
  ssize_t ignored = ::write(fd, report, sizeof report);
  (void)ignored;
  ::_exit(127);
}

[[noreturn]] void exec_child(const ChildPlan& plan) {
  // Handlers are the parent's (its shutdown handler writes to the parent's pipe): reset them.
  // Keep an inherited SIG_IGN (nohup), except for the signals the protocol needs.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    const bool plain = !(old.sa_flags & SA_SIGINFO);
    if (plain && old.sa_handler == SIG_DFL) continue;
    if (plain && old.sa_handler == SIG_IGN && sig != SIGPIPE && sig != SIGXFSZ && sig != SIGTERM) {
      continue;
    }
    ::sigaction(sig, &dfl, nullptr);
  }
  // The forking thread blocks every signal; the worker starts with none blocked.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  const int error_fd = plan.error_fd;
  if (::dup2(plan.stdin_fd, 0) < 0) child_fail(error_fd, 1);
  if (plan.log_fd >= 0) {
    if (::dup2(plan.log_fd, 1) < 0 || ::dup2(plan.log_fd, 2) < 0) child_fail(error_fd, 1);
  } else {
    ::dup2(2, 1);  // fails only when our stderr is closed: then the child's stdout stays ours
  }
  if (::dup2(plan.ready_fd, kReadyFd) < 0) child_fail(error_fd, 1);  // dup2 clears CLOEXEC
  if (::dup3(error_fd, kExecErrorFd, O_CLOEXEC) < 0) child_fail(error_fd, 1);

  // Every other descriptor goes, also those other code of the parent opened without O_CLOEXEC.
  bool closed = false;
#ifdef SYS_close_range
  closed = ::syscall(SYS_close_range, kExecErrorFd + 1, ~0U, 0) == 0;
#endif
  if (!closed) {
    for (int fd = kExecErrorFd + 1; fd < plan.max_fd; ++fd) ::close(fd);
  }
  // Killed when the forking thread (ours lives as long as the process) or the process dies; if
  // the parent died before prctl, the child has been re-parented already.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(kExecErrorFd, 1);
  if (::getppid() != plan.parent) ::_exit(127);
  ::execve(plan.path, plan.argv, plan.envp);
  child_fail(kExecErrorFd, 0);
}

// Forks every child from one thread that lives as long as the process: PR_SET_PDEATHSIG fires
// when the thread that forked a child ends, and the threads that call start() may be short-lived
// (start_all's). The thread blocks every signal, so the children start with all blocked (no
// handler of ours can run in a child before its handlers are reset).
class Spawner {
 public:
  static Spawner& get() {
    // Never destroyed: its thread never ends. A child fork()ed from this process (without exec)
    // has no spawner thread: it makes its own.
    static std::mutex mu;
    static Spawner* spawner = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (spawner == nullptr || spawner->owner_ != ::getpid()) spawner = new Spawner();
    return *spawner;
  }

  pid_t spawn(const ChildPlan& plan) {
    Request request;
    request.plan = &plan;
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(&request);
    work_.notify_one();
    done_.wait(lock, [&] { return request.done; });
    if (request.pid < 0) {
      throw std::runtime_error("fork: " + errno_text(request.error));
    }
    return request.pid;
  }

 private:
  struct Request {
    const ChildPlan* plan = nullptr;
    pid_t pid = -1;
    int error = 0;
    bool done = false;
  };

  Spawner() {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::thread(&Spawner::loop, this).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  void loop() {
    for (;;) {
      Request* request = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return !queue_.empty(); });
        request = queue_.front();
        queue_.pop_front();
      }
      const pid_t pid = ::fork();
      if (pid == 0) exec_child(*request->plan);
      const int error = errno;
      {
        std::lock_guard<std::mutex> lock(mu_);
        request->pid = pid;
        request->error = error;
        request->done = true;
      }
      done_.notify_all();
    }
  }

  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::deque<Request*> queue_;
};

}  // namespace

// --- WorkerProcess ---------------------------------------------------------------------------

WorkerProcess::WorkerProcess(WorkerSpec spec)
    : spec_(std::move(spec)),
      name_(spec_.name.empty() && !spec_.argv.empty() ? spec_.argv[0] : spec_.name) {
  if (spec_.argv.empty()) {
    throw std::invalid_argument("worker '" + spec_.name + "': argv is empty");
  }
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.processes.insert(this);
}

WorkerProcess::~WorkerProcess() {
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.processes.erase(this);
  }
  stop();
}

bool WorkerProcess::live_locked() const {
  if (pid_ <= 0 || reaped_) return false;
  int raw = 0;
  pid_t rc;
  do {
    rc = ::waitpid(pid_, &raw, WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return true;
  reaped_ = true;
  raw_status_ = rc == pid_ ? raw : -1;  // ECHILD: someone else reaped it
  return false;
}

bool WorkerProcess::wait_exit(Clock::time_point deadline) const {
  auto step = milliseconds(1);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!live_locked()) return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(step, deadline - now));
    step = std::min(step * 2, milliseconds(20));
  }
}

std::string WorkerProcess::exit_description() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reaped_ || pid_ <= 0) return "is running";
  if (raw_status_ < 0) return describe_status(-1);
  if (WIFSIGNALED(raw_status_)) return "was killed by " + describe_signal(WTERMSIG(raw_status_));
  return "exited with status " + std::to_string(WEXITSTATUS(raw_status_));
}

bool WorkerProcess::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_locked();
}

std::optional<int> WorkerProcess::exit_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ <= 0 || live_locked()) return std::nullopt;
  if (raw_status_ < 0) return -1;
  if (WIFSIGNALED(raw_status_)) return 128 + WTERMSIG(raw_status_);
  return WEXITSTATUS(raw_status_);
}

pid_t WorkerProcess::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pid_;
}

std::string WorkerProcess::address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return address_;
}

void WorkerProcess::stop(milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stop_epoch_;
    if (!live_locked()) return;
    ::kill(pid_, SIGTERM);  // not reaped yet: the pid is still ours
  }
  if (wait_exit(Clock::now() + grace)) return;
  kill_now();
}

void WorkerProcess::kill_now() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_locked()) return;
    ::kill(pid_, SIGKILL);
  }
  wait_exit(Clock::time_point::max());
}

std::string WorkerProcess::start() { return start_impl(nullptr); }

std::string WorkerProcess::start_impl(const std::atomic<bool>* cancel) {
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (starting_) throw std::logic_error(name_ + " is already being started");
    if (live_locked()) {
      throw std::logic_error(name_ + " is already running (pid " + std::to_string(pid_) + ")");
    }
    starting_ = true;
    epoch = stop_epoch_;
    address_.clear();
  }
  struct StartingReset {
    WorkerProcess* self;
    ~StartingReset() {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->starting_ = false;
    }
  } starting_reset{this};
  const auto aborted = [&] {
    if (cancel != nullptr && cancel->load()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return stop_epoch_ != epoch;
  };
  if (aborted()) throw std::runtime_error(name_ + " was stopped before it was ready");

  // Everything the child needs, made before the fork.
  const std::string program = resolve_program(spec_.argv[0]);
  std::vector<std::string> args = spec_.argv;
  args.emplace_back("--ready-fd");
  args.emplace_back(std::to_string(kReadyFd));
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_entries;
  for (const auto& [key, value] : spec_.env) {
    std::string entry = key;
    entry += '=';
    entry += value;
    env_entries.push_back(std::move(entry));
  }
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view inherited(*entry);
    const bool replaced = std::any_of(spec_.env.begin(), spec_.env.end(), [&](const auto& kv) {
      return inherited.size() > kv.first.size() && inherited[kv.first.size()] == '=' &&
             inherited.substr(0, kv.first.size()) == kv.first;
    });
    if (!replaced) env_entries.emplace_back(inherited);
  }
  std::vector<char*> envp;
  for (auto& entry : env_entries) envp.push_back(entry.data());
  envp.push_back(nullptr);

  Fd log_fd, null_fd, ready_read, ready_write, error_read, error_write;
  off_t log_start = 0;
  if (!spec_.log_path.empty()) {
    log_fd.reset(::open(spec_.log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    if (log_fd.get() < 0) throw sys_error(name_ + ": cannot open its log " + spec_.log_path);
    struct stat st {};
    if (::fstat(log_fd.get(), &st) == 0) log_start = st.st_size;
  }
  null_fd.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (null_fd.get() < 0) throw sys_error("open /dev/null");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw sys_error("pipe2");
  ready_read.reset(fds[0]);
  ready_write.reset(fds[1]);
  if (::pipe2(fds, O_CLOEXEC) != 0) throw sys_error("pipe2");
  error_read.reset(fds[0]);
  error_write.reset(fds[1]);
  for (Fd* fd : {&log_fd, &null_fd, &ready_write, &error_write}) fd->raise();

  ChildPlan plan;
  plan.path = program.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.stdin_fd = null_fd.get();
  plan.log_fd = log_fd.get();
  plan.ready_fd = ready_write.get();
  plan.error_fd = error_write.get();
  plan.parent = ::getpid();
  const long open_max = ::sysconf(_SC_OPEN_MAX);
  plan.max_fd = static_cast<int>(std::clamp<long>(open_max, 256, 65536));

  const auto started = Clock::now();
  const pid_t pid = Spawner::get().spawn(plan);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pid_ = pid;
    reaped_ = false;
    raw_status_ = 0;
  }
  ready_write.reset();
  error_write.reset();
  null_fd.reset();
  log_fd.reset();

  const auto fail = [&](const std::string& what) {
    std::string message = name_ + " " + what;
    if (!spec_.log_path.empty()) {
      const std::string tail = read_log_tail(spec_.log_path, log_start, kLogTailLines);
      message += tail.empty() ? " (its log " + spec_.log_path + " is empty)"
                              : " (last lines of its log " + spec_.log_path + ":\n" + tail + ")";
    }
    return std::runtime_error(message);
  };

  // The exec-error pipe: closed by a successful exec, or the reason it failed.
  int report[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof report) {
    const ssize_t n =
        ::read(error_read.get(), reinterpret_cast<char*>(report) + got, sizeof report - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == sizeof report) {
    wait_exit(Clock::time_point::max());  // it calls _exit(127) right after the report
    throw std::runtime_error(name_ + ": could not run " + program + ": " +
                             (report[0] == 0 ? "" : "setting up the child: ") +
                             errno_text(report[1]));
  }

  // The ready line.
  const auto deadline = started + spec_.startup_timeout;
  std::string line;
  bool ended = false;  // EOF on the pipe, or the child exited
  for (;;) {
    if (aborted()) {
      kill_now();
      throw fail("was stopped before it was ready");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      kill_now();
      throw fail("did not come up within " + format_duration(spec_.startup_timeout));
    }
    const auto left = std::chrono::ceil<milliseconds>(deadline - now);
    pollfd pfd{ready_read.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    if (rc < 0 && errno != EINTR) {
      const auto error = sys_error(name_ + ": poll");
      kill_now();
      throw error;
    }
    if (rc > 0) {
      char buffer[512];
      const ssize_t n = ::read(ready_read.get(), buffer, sizeof buffer);
      if (n > 0) {
        line.append(buffer, static_cast<size_t>(n));
        if (line.find('\n') != std::string::npos) break;
        if (line.size() > kMaxReadyLine) {
          kill_now();
          throw fail("wrote a ready line longer than " + std::to_string(kMaxReadyLine) + " bytes");
        }
      } else if (n == 0) {
        ended = true;
        break;
      } else if (errno != EINTR && errno != EAGAIN) {
        const auto error = sys_error(name_ + ": read from its ready pipe");
        kill_now();
        throw error;
      }
    } else if (!running()) {  // exited, but a child of its own still holds the pipe
      ended = true;
      break;
    }
  }
  if (ended && line.empty()) {
    if (!wait_exit(Clock::now() + std::chrono::seconds(2))) {
      kill_now();
      throw fail("closed its ready fd without writing 'LISTENING <host>:<port>'");
    }
    if (aborted()) throw fail("was stopped before it was ready");
    throw fail(exit_description() + " before it was ready");
  }

  line.erase(std::min(line.find('\n'), line.size()));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const std::string prefix = "LISTENING ";
  const bool valid = line.compare(0, prefix.size(), prefix) == 0 &&
                     line.find(':', prefix.size()) != std::string::npos && line.back() != ':';
  if (!valid) {
    kill_now();
    throw fail("wrote '" + line + "' to its ready fd instead of 'LISTENING <host>:<port>'");
  }
  if (aborted()) {
    kill_now();
    throw fail("was stopped before it was ready");
  }
  std::lock_guard<std::mutex> lock(mu_);
  address_ = line.substr(prefix.size());
  return address_;
}

}  // namespace omni::pipeline
