// WorkerProcess and WorkerSupervisor against tests/worker/pipeline/fake_worker.cc, a program
// that speaks the start-up protocol and misbehaves on request. Two tests need a process that
// dies or gets a signal: they re-run this binary as a helper (see run_helper_if_asked).
#include "worker/process/worker_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace omni::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace std::chrono_literals;

constexpr const char* kHelperEnv = "OMNI_WORKER_PROCESS_TEST_HELPER";

WorkerSpec fake(const std::string& name, const std::string& mode, const std::string& log_path = "",
                std::vector<std::string> extra = {}) {
  WorkerSpec spec;
  spec.name = name;
  spec.argv = {OMNI_FAKE_WORKER, "--mode", mode};
  spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
  spec.log_path = log_path;
  spec.startup_timeout = 10s;
  return spec;
}

// A fresh directory for one test's logs.
std::string temp_dir() {
  std::string pattern = ::testing::TempDir() + "worker_process_XXXXXX";
  const char* dir = ::mkdtemp(pattern.data());
  if (dir == nullptr) throw std::runtime_error("mkdtemp failed");
  return dir;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool can_connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// False for a pid <= 0 (no process was made): kill(0 or -1, 0) would ask about whole groups.
bool gone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

// Not a child of ours any more: reaped (no zombie left behind).
bool reaped(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) < 0 && errno == ECHILD;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename Predicate>
bool eventually(Predicate predicate, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!predicate()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string start_error(WorkerProcess& worker) {
  try {
    worker.start();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

// --- helper processes ----------------------------------------------------------------------

// This binary run with OMNI_WORKER_PROCESS_TEST_HELPER=<mode> is a helper: before main, it
// starts workers, prints "PID <pid>" for each and "READY" to stdout, and waits to be killed.
//   orphan:   a supervisor with one worker (started by start_all, from a thread that ended)
//   shutdown: install_shutdown_handler(500 ms); a supervisor with an ok and an ignore-term
//             worker, and a WorkerProcess of its own
[[noreturn]] void run_helper(const std::string& mode) {
  try {
    if (mode == "shutdown") install_shutdown_handler(500ms);
    auto* supervisor = new WorkerSupervisor();  // never destroyed: the helper is killed
    std::vector<WorkerSpec> specs = {fake("stage 0", "ok")};
    if (mode == "shutdown") specs.push_back(fake("stage 1", "ignore-term"));
    supervisor->start_all(specs);
    std::vector<pid_t> pids;
    for (size_t i = 0; i < supervisor->size(); ++i) pids.push_back(supervisor->pid(i));
    if (mode == "shutdown") {
      auto* single = new WorkerProcess(fake("single", "ok"));
      single->start();
      pids.push_back(single->pid());
    }
    for (const pid_t pid : pids) std::printf("PID %d\n", static_cast<int>(pid));
    std::printf("READY\n");
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "helper: %s\n", e.what());
    std::_Exit(3);
  }
  for (;;) ::pause();
}

int run_helper_if_asked() {
  if (const char* mode = std::getenv(kHelperEnv)) run_helper(mode);
  return 0;
}
const int helper_check = run_helper_if_asked();

struct Helper {
  pid_t pid = -1;
  std::vector<pid_t> workers;
};

// Runs this binary as a helper in `mode` and reads the pids of its workers.
Helper spawn_helper(const std::string& mode) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe");
  self[n] = '\0';
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kHelperEnv) + "=" + mode);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string arg0 = self;
  char* argv[] = {arg0.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  Helper helper;
  const int rc = ::posix_spawn(&helper.pid, self, &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) throw std::runtime_error("posix_spawn: " + std::string(std::strerror(rc)));
  std::string text;
  const auto deadline = Clock::now() + 20s;
  while (text.find("READY\n") == std::string::npos && Clock::now() < deadline) {
    pollfd pfd{out[0], POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    char buffer[256];
    const ssize_t got = ::read(out[0], buffer, sizeof buffer);
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  ::close(out[0]);
  std::istringstream lines(text);
  std::string word;
  while (lines >> word) {
    if (word == "PID") {
      int pid = 0;
      lines >> pid;
      helper.workers.push_back(pid);
    }
  }
  if (text.find("READY\n") == std::string::npos) {
    ::kill(helper.pid, SIGKILL);
    ::waitpid(helper.pid, nullptr, 0);
    throw std::runtime_error("the helper did not get ready: '" + text + "'");
  }
  return helper;
}

// Orphans of our helpers are re-parented to this process while it lives (so that the tests see
// whether the helper reaped them, and how they died).
struct SubreaperScope {
  SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

// --- WorkerProcess -----------------------------------------------------------------------------

TEST(WorkerProcess, StartReturnsAConnectableAddress) {
  const std::string log = temp_dir() + "/stage0.log";
  WorkerProcess worker(fake("stage 0 (thinker)", "ok", log));
  const std::string address = worker.start();
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_EQ(worker.address(), address);
  EXPECT_TRUE(can_connect(address)) << address;
  EXPECT_TRUE(worker.running());
  EXPECT_GT(worker.pid(), 0);
  EXPECT_FALSE(worker.exit_status().has_value());
  EXPECT_NE(read_file(log).find("listening on " + address), std::string::npos) << read_file(log);
  worker.stop();
  EXPECT_FALSE(worker.running());
  EXPECT_EQ(worker.exit_status(), 0);
}

TEST(WorkerProcess, ExitBeforeReadyNamesTheWorkerTheStatusAndTheLog) {
  const std::string log = temp_dir() + "/talker.log";
  {
    std::ofstream earlier(log);
    earlier << "a line of an earlier run\n";
  }
  WorkerProcess worker(fake("stage 1 (talker)", "exit3", log));
  const std::string error = start_error(worker);
  EXPECT_NE(error.find("stage 1 (talker) exited with status 3 before it was ready"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("fatal: bad config"), std::string::npos) << error;
  EXPECT_EQ(error.find("earlier run"), std::string::npos) << "only this run's lines: " << error;
  EXPECT_EQ(worker.exit_status(), 3);
  EXPECT_TRUE(reaped(worker.pid()));
  EXPECT_NE(read_file(log).find("a line of an earlier run"), std::string::npos)
      << "the log is appended to";
}

TEST(WorkerProcess, HangTimesOutAndLeavesNoChild) {
  WorkerSpec spec = fake("stage 2 (code2wav)", "hang", temp_dir() + "/hang.log");
  spec.startup_timeout = 300ms;
  WorkerProcess worker(spec);
  const auto start = Clock::now();
  const std::string error = start_error(worker);
  EXPECT_NE(error.find("stage 2 (code2wav) did not come up within 300 ms"), std::string::npos)
      << error;
  EXPECT_NE(error.find("fake_worker: mode hang"), std::string::npos) << error;
  EXPECT_GE(seconds_since(start), 0.3);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_TRUE(gone(worker.pid()));
  EXPECT_FALSE(worker.running());
}

TEST(WorkerProcess, StopSendsSigtermAndReaps) {
  WorkerProcess worker(fake("w", "ok"));
  worker.start();
  const pid_t pid = worker.pid();
  const auto start = Clock::now();
  worker.stop(5000ms);
  EXPECT_LT(seconds_since(start), 1.0) << "SIGTERM is honoured, no wait for the grace";
  EXPECT_EQ(worker.exit_status(), 0) << "the fake worker exits 0 on SIGTERM";
  EXPECT_TRUE(reaped(pid));
  EXPECT_TRUE(gone(pid));
  worker.stop();  // idempotent
  worker.kill_now();
  EXPECT_EQ(worker.exit_status(), 0);
}

TEST(WorkerProcess, StopEscalatesToSigkillAfterTheGrace) {
  WorkerProcess worker(fake("w", "ignore-term"));
  worker.start();
  const pid_t pid = worker.pid();
  const auto start = Clock::now();
  worker.stop(300ms);
  EXPECT_GE(seconds_since(start), 0.3);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(worker.exit_status(), 128 + SIGKILL);
  EXPECT_TRUE(reaped(pid));
}

TEST(WorkerProcess, KillNowAndStartAgain) {
  WorkerProcess worker(fake("w", "ok"));
  const std::string first = worker.start();
  const pid_t first_pid = worker.pid();
  EXPECT_THROW(worker.start(), std::logic_error) << "it is running";
  worker.kill_now();
  EXPECT_EQ(worker.exit_status(), 128 + SIGKILL);
  EXPECT_TRUE(reaped(first_pid));
  const std::string second = worker.start();
  EXPECT_NE(worker.pid(), first_pid);
  EXPECT_TRUE(can_connect(second));
}

TEST(WorkerProcess, KilledBeforeReady) {
  WorkerSpec spec = fake("stage 3", "hang");
  WorkerProcess worker(spec);
  std::thread killer([&] {
    eventually([&] { return worker.running(); }, 5s);
    ::kill(worker.pid(), SIGKILL);
  });
  const std::string error = start_error(worker);
  killer.join();
  EXPECT_NE(error.find("stage 3 was killed by signal 9 (SIGKILL) before it was ready"),
            std::string::npos)
      << error;
}

TEST(WorkerProcess, StopFromAnotherThreadAbortsStart) {
  WorkerSpec spec = fake("stage 4", "hang");
  spec.startup_timeout = 60s;
  WorkerProcess worker(spec);
  std::thread stopper([&] {
    eventually([&] { return worker.running(); }, 5s);
    std::this_thread::sleep_for(100ms);
    worker.stop();
  });
  const auto start = Clock::now();
  const std::string error = start_error(worker);
  stopper.join();
  EXPECT_NE(error.find("stage 4 was stopped before it was ready"), std::string::npos) << error;
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_TRUE(gone(worker.pid()));
}

TEST(WorkerProcess, MissingProgram) {
  WorkerSpec spec;
  spec.name = "stage 5";
  spec.argv = {"/nonexistent/vllm-omni", "worker"};
  WorkerProcess worker(spec);
  const std::string error = start_error(worker);
  EXPECT_NE(error.find("stage 5: could not run /nonexistent/vllm-omni: No such file"),
            std::string::npos)
      << error;
}

TEST(WorkerProcess, WrongReadyLine) {
  WorkerProcess worker(fake("stage 6", "bad-line"));
  const std::string error = start_error(worker);
  EXPECT_NE(error.find("stage 6 wrote 'HELLO' to its ready fd instead of 'LISTENING"),
            std::string::npos)
      << error;
  EXPECT_TRUE(gone(worker.pid()));
}

TEST(WorkerProcess, ReadyFdClosedWithoutTheLine) {
  WorkerProcess worker(fake("stage 7", "no-line"));
  const std::string error = start_error(worker);
  EXPECT_NE(error.find("stage 7 closed its ready fd without writing"), std::string::npos) << error;
  EXPECT_TRUE(gone(worker.pid()));
}

TEST(WorkerProcess, OnlyStdioAndTheReadyFdAreInherited) {
  const std::string log = temp_dir() + "/fds.log";
  int leaky[2];
  ASSERT_EQ(::pipe(leaky), 0);  // no O_CLOEXEC, as careless code elsewhere in a process may do
  WorkerProcess worker(fake("w", "ok", log));
  worker.start();
  worker.stop();
  ::close(leaky[0]);
  ::close(leaky[1]);
  EXPECT_NE(read_file(log).find("open fds: 0 1 2 3\n"), std::string::npos) << read_file(log);
}

TEST(WorkerProcess, OutlivesTheThreadThatStartedIt) {
  // PR_SET_PDEATHSIG fires when the forking *thread* ends: the fork must not happen on it.
  WorkerProcess worker(fake("w", "ok"));
  std::string address;
  std::thread([&] { address = worker.start(); }).join();
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(worker.running());
  EXPECT_TRUE(can_connect(address));
}

// --- WorkerSupervisor --------------------------------------------------------------------------

// The NAME=value entries of a process's environment (Linux: /proc/PID/environ).
std::vector<std::string> environment_of(pid_t pid) {
  const std::string text = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::vector<std::string> entries;
  for (size_t pos = 0, end; pos < text.size(); pos = end + 1) {
    end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    entries.push_back(text.substr(pos, end - pos));
  }
  return entries;
}

int count_of(const std::vector<std::string>& entries, const std::string& entry) {
  return static_cast<int>(std::count(entries.begin(), entries.end(), entry));
}

// A secret for the worker travels in its environment, over an inherited variable of the same
// name, and stays off its command line, also when the supervisor restarts it.
TEST(WorkerSupervisor, SpecEnvironmentReachesTheWorkerAndItsRestarts) {
  ::setenv("OMNI_TEST_SECRET", "inherited", 1);
  WorkerSpec spec = fake("w", "ok");
  spec.env = {{"OMNI_TEST_SECRET", "f00dcafe"}};
  WorkerSupervisor::Options options;
  options.poll_interval = 50ms;
  WorkerSupervisor supervisor(options);
  supervisor.start_all({spec});
  ::unsetenv("OMNI_TEST_SECRET");
  const pid_t first = supervisor.pid(0);
  for (const pid_t pid : {first, pid_t{-1}}) {
    if (pid < 0) {  // the second round: the restarted worker
      ASSERT_EQ(::kill(first, SIGKILL), 0);
      supervisor.wait_ready(0, 5s, 2);
    }
    const pid_t worker = supervisor.pid(0);
    const auto env = environment_of(worker);
    EXPECT_EQ(count_of(env, "OMNI_TEST_SECRET=f00dcafe"), 1) << "pid " << worker;
    EXPECT_EQ(count_of(env, "OMNI_TEST_SECRET=inherited"), 0) << "pid " << worker;
    EXPECT_EQ(count_of(env, std::string("PATH=") + std::getenv("PATH")), 1) << "inherited";
    const std::string cmdline = read_file("/proc/" + std::to_string(worker) + "/cmdline");
    EXPECT_NE(cmdline.find("--mode"), std::string::npos) << "the command line was read";
    EXPECT_EQ(cmdline.find("f00dcafe"), std::string::npos) << cmdline;
  }
  EXPECT_NE(supervisor.pid(0), first);
}

struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<size_t, int>> exits;
  std::vector<std::pair<size_t, std::string>> restarted;
  std::vector<std::pair<size_t, std::string>> failed;

  void attach(WorkerSupervisor& supervisor) {
    supervisor.set_callbacks(
        [this](size_t i, int status) {
          std::lock_guard<std::mutex> lock(mu);
          exits.emplace_back(i, status);
          cv.notify_all();
        },
        [this](size_t i, const std::string& address) {
          std::lock_guard<std::mutex> lock(mu);
          restarted.emplace_back(i, address);
          cv.notify_all();
        },
        [this](size_t i, const std::string& message) {
          std::lock_guard<std::mutex> lock(mu);
          failed.emplace_back(i, message);
          cv.notify_all();
        });
  }
  template <typename Predicate>
  bool wait(Predicate predicate, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return predicate(*this); });
  }
};

TEST(WorkerSupervisor, StartsInParallelAndRestartsADeadWorker) {
  const std::string dir = temp_dir();
  WorkerSupervisor::Options options;
  options.poll_interval = 50ms;
  WorkerSupervisor supervisor(options);
  Events events;
  events.attach(supervisor);
  std::vector<WorkerSpec> specs;
  for (int i = 0; i < 3; ++i) {
    specs.push_back(
        fake("stage " + std::to_string(i), "slow", dir + "/" + std::to_string(i) + ".log"));
  }
  const auto start = Clock::now();
  const auto addresses = supervisor.start_all(specs);
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 1.4) << "three 500 ms start-ups in parallel, not one after the other";
  ASSERT_EQ(addresses.size(), 3u);
  std::vector<pid_t> pids;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(can_connect(addresses[i])) << addresses[i];
    EXPECT_EQ(supervisor.address(i), addresses[i]);
    EXPECT_EQ(supervisor.generation(i), 1u);
    pids.push_back(supervisor.pid(i));
  }
  EXPECT_EQ(supervisor.wait_ready(1, 1s), addresses[1]);

  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  ASSERT_TRUE(events.wait([](Events& e) { return !e.exits.empty(); }, 5s));
  {
    std::lock_guard<std::mutex> lock(events.mu);
    EXPECT_EQ(events.exits[0], std::make_pair(size_t{1}, 128 + SIGKILL));
  }
  const std::string address = supervisor.wait_ready(1, 5s, 2);
  EXPECT_EQ(supervisor.generation(1), 2u);
  EXPECT_NE(supervisor.pid(1), pids[1]);
  EXPECT_TRUE(reaped(pids[1]));
  EXPECT_TRUE(can_connect(address)) << address;
  EXPECT_EQ(supervisor.address(1), address);
  ASSERT_TRUE(events.wait([](Events& e) { return !e.restarted.empty(); }, 5s));
  {
    std::lock_guard<std::mutex> lock(events.mu);
    EXPECT_EQ(events.restarted[0], std::make_pair(size_t{1}, address));
    EXPECT_EQ(events.exits.size(), 1u);
    EXPECT_TRUE(events.failed.empty());
  }
  EXPECT_EQ(supervisor.pid(0), pids[0]);
  EXPECT_EQ(supervisor.pid(2), pids[2]);
  EXPECT_EQ(supervisor.generation(0), 1u);
  EXPECT_EQ(supervisor.generation(2), 1u);

  const pid_t restarted_pid = supervisor.pid(1);
  supervisor.stop_all();
  for (const pid_t pid : {pids[0], restarted_pid, pids[2]}) {
    EXPECT_TRUE(reaped(pid));
    EXPECT_TRUE(gone(pid));
  }
  EXPECT_THROW(supervisor.wait_ready(0, 1s), std::runtime_error);
  {
    std::lock_guard<std::mutex> lock(events.mu);
    EXPECT_EQ(events.exits.size(), 1u) << "stop_all is no crash";
  }
}

TEST(WorkerSupervisor, WorkersOutliveTheStartingThreads) {
  WorkerSupervisor supervisor;
  supervisor.start_all({fake("a", "ok"), fake("b", "ok")});
  const pid_t a = supervisor.pid(0), b = supervisor.pid(1);
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(gone(a));
  EXPECT_FALSE(gone(b));
  EXPECT_EQ(supervisor.pid(0), a) << "not restarted";
  EXPECT_EQ(supervisor.generation(0), 1u);
  EXPECT_EQ(supervisor.generation(1), 1u);
}

TEST(WorkerSupervisor, GivesUpAfterMaxRestartsOfShortLivedWorkers) {
  WorkerSupervisor::Options options;
  options.max_restarts = 2;
  options.poll_interval = 20ms;
  WorkerSupervisor supervisor(options);
  Events events;
  events.attach(supervisor);
  supervisor.start_all({fake("stage 1 (talker)", "ok-then-exit", "", {"--exit-after-ms", "200"})});
  ASSERT_TRUE(events.wait([](Events& e) { return !e.failed.empty(); }, 10s));
  std::lock_guard<std::mutex> lock(events.mu);
  EXPECT_EQ(events.failed[0].first, 0u);
  const std::string& message = events.failed[0].second;
  EXPECT_NE(message.find("stage 1 (talker) is down: gave up after 2 restart(s) in a row"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("exited with status 1"), std::string::npos) << message;
  EXPECT_EQ(events.exits.size(), 3u);
  EXPECT_EQ(events.restarted.size(), 2u);
  EXPECT_EQ(supervisor.generation(0), 3u);
  try {
    supervisor.wait_ready(0, 1s);
    ADD_FAILURE() << "wait_ready returned for a worker given up";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(WorkerSupervisor, GivesUpWhenRestartsFail) {
  const std::string dir = temp_dir();
  WorkerSupervisor::Options options;
  options.max_restarts = 2;
  options.poll_interval = 20ms;
  WorkerSupervisor supervisor(options);
  Events events;
  events.attach(supervisor);
  supervisor.start_all({fake("stage 2", "ok-then-exit", dir + "/w.log",
                             {"--exit-after-ms", "100", "--once-file", dir + "/once"})});
  ASSERT_TRUE(events.wait([](Events& e) { return !e.failed.empty(); }, 10s));
  std::lock_guard<std::mutex> lock(events.mu);
  const std::string& message = events.failed[0].second;
  EXPECT_NE(message.find("gave up after 2"), std::string::npos) << message;
  EXPECT_NE(message.find("stage 2 exited with status 3 before it was ready"), std::string::npos)
      << message;
  EXPECT_NE(message.find("fatal: bad config"), std::string::npos) << message;
  EXPECT_EQ(events.exits.size(), 1u) << "failed starts are no exits of a running worker";
  EXPECT_TRUE(events.restarted.empty());
  EXPECT_EQ(supervisor.generation(0), 1u);
}

TEST(WorkerSupervisor, AFailedStartStopsTheOthersAtOnce) {
  WorkerSupervisor supervisor;
  WorkerSpec hang = fake("stage 2 (code2wav)", "hang");
  hang.startup_timeout = 60s;
  const std::string dir = temp_dir();
  const auto start = Clock::now();
  try {
    supervisor.start_all(
        {fake("stage 0 (thinker)", "ok"), fake("stage 1 (talker)", "exit3", dir + "/1.log"), hang});
    ADD_FAILURE() << "start_all succeeded";
  } catch (const std::runtime_error& e) {
    const std::string error = e.what();
    EXPECT_NE(error.find("stage 1 (talker) exited with status 3"), std::string::npos) << error;
    EXPECT_NE(error.find("fatal: bad config"), std::string::npos) << error;
  }
  EXPECT_LT(seconds_since(start), 5.0) << "not waiting for the hanging worker's 60 s";
  // A worker whose start was cancelled before its fork (the talker can fail before the
  // code2wav's watcher gets that far) has no process at all: pid -1.
  for (const size_t i : {0u, 1u, 2u}) {
    const pid_t pid = supervisor.pid(i);
    EXPECT_TRUE(pid == -1 || gone(pid)) << i << ": pid " << pid;
  }
  // All stopped: the supervisor can start again.
  const auto addresses = supervisor.start_all({fake("stage 0 (thinker)", "ok")});
  EXPECT_TRUE(can_connect(addresses[0]));
  EXPECT_THROW(supervisor.start_all({fake("x", "ok")}), std::logic_error) << "still managed";
}

// --- the process as a whole ----------------------------------------------------------------------

TEST(WorkerProcessDeath, WorkersDieWithTheirParentProcess) {
  SubreaperScope subreaper;
  const Helper helper = spawn_helper("orphan");
  ASSERT_EQ(helper.workers.size(), 1u);
  const pid_t worker = helper.workers[0];
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(gone(worker)) << "alive 1 s after start_all, whose threads have ended";
  ASSERT_EQ(::kill(helper.pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(helper.pid, &status, 0), helper.pid);
  // The orphan is re-parented to this process (a subreaper): see how and when it ends.
  const auto start = Clock::now();
  pid_t reaped_pid = 0;
  while (reaped_pid == 0 && seconds_since(start) < 2.0) {
    reaped_pid = ::waitpid(worker, &status, WNOHANG);
    if (reaped_pid == 0) std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(reaped_pid, worker) << "the worker outlived its parent by 2 s";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "PR_SET_PDEATHSIG";
}

class ShutdownHandler : public ::testing::TestWithParam<int> {};

TEST_P(ShutdownHandler, StopsEveryWorkerAndExitsWith128PlusTheSignal) {
  const int sig = GetParam();
  SubreaperScope subreaper;
  const Helper helper = spawn_helper("shutdown");
  ASSERT_EQ(helper.workers.size(), 3u);
  const auto start = Clock::now();
  ASSERT_EQ(::kill(helper.pid, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(helper.pid, &status, 0), helper.pid);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by the signal itself: no handler ran";
  EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
  EXPECT_GE(seconds_since(start), 0.5) << "the ignore-term worker gets its grace";
  EXPECT_LT(seconds_since(start), 5.0);
  for (const pid_t worker : helper.workers) {
    // Reaped by the helper: not left to us as an orphan, nor running.
    EXPECT_TRUE(reaped(worker)) << worker;
    EXPECT_TRUE(gone(worker)) << worker;
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, ShutdownHandler, ::testing::Values(SIGTERM, SIGINT),
                         [](const auto& param_info) {
                           return param_info.param == SIGTERM ? "SIGTERM" : "SIGINT";
                         });

}  // namespace
}  // namespace omni::pipeline
