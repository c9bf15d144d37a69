// A stand-in for `vllm-omni worker` that speaks the start-up protocol of
// worker/process/worker_process.h and misbehaves on request:
//   fake_worker --mode M [--port-file P] [--exit-after-ms N] [--once-file F] --ready-fd K
// Modes:
//   ok            listen on 127.0.0.1:0, write "LISTENING 127.0.0.1:<port>\n" to fd K, accept
//                 connections until SIGTERM, then exit 0
//   slow          as ok, but 500 ms before the line
//   ignore-term   as ok, but SIGTERM is ignored (only SIGKILL ends it)
//   ok-then-exit  as ok, then exit 1 after --exit-after-ms (default 1000)
//   exit3         print "fatal: bad config" to stderr and exit 3 before the line
//   hang          never write the line
//   bad-line      write "HELLO\n" instead of the line, then wait
//   no-line       close fd K without writing, then wait
// --once-file F: the first run creates F and goes on; a run that finds F acts as exit3 (a worker
// that came up once and then fails to start again).
// Every mode first prints "fake_worker: mode M, open fds: 0 1 2 3" (the descriptors it
// inherited) to stderr, and writes its port to --port-file when one is given.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void on_term(int) { ::_exit(0); }

std::string open_fds() {
  std::vector<int> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return "?";
  const int own = ::dirfd(dir);
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd != own) fds.push_back(fd);
  }
  ::closedir(dir);
  std::string text;
  for (size_t i = 0; i < fds.size(); ++i) text += (i ? " " : "") + std::to_string(fds[i]);
  return text;
}

[[noreturn]] void wait_forever() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "ok";
  std::string port_file;
  int ready_fd = -1;
  int exit_after_ms = 1000;
  std::string once_file;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--mode") {
      mode = argv[++i];
    } else if (flag == "--port-file") {
      port_file = argv[++i];
    } else if (flag == "--ready-fd") {
      ready_fd = std::atoi(argv[++i]);
    } else if (flag == "--exit-after-ms") {
      exit_after_ms = std::atoi(argv[++i]);
    } else if (flag == "--once-file") {
      once_file = argv[++i];
    }
  }
  std::fprintf(stderr, "fake_worker: mode %s, open fds: %s\n", mode.c_str(), open_fds().c_str());
  if (ready_fd < 0) {
    std::fprintf(stderr, "fake_worker: no --ready-fd\n");
    return 2;
  }
  ::signal(SIGTERM, mode == "ignore-term" ? SIG_IGN : on_term);

  if (!once_file.empty()) {
    if (::access(once_file.c_str(), F_OK) == 0) {
      mode = "exit3";
    } else if (FILE* file = std::fopen(once_file.c_str(), "w")) {
      std::fclose(file);
    }
  }
  if (mode == "exit3") {
    std::fprintf(stderr, "fatal: bad config\n");
    return 3;
  }
  if (mode == "hang") wait_forever();
  if (mode == "bad-line") {
    const char line[] = "HELLO\n";
    if (::write(ready_fd, line, sizeof line - 1) < 0) return 2;
    wait_forever();
  }
  if (mode == "no-line") {
    ::close(ready_fd);
    wait_forever();
  }
  if (mode == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(500));

  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the OS picks a free port
  socklen_t len = sizeof addr;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 16) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("fake_worker: listen");
    return 2;
  }
  const int port = ntohs(addr.sin_port);
  if (!port_file.empty()) {
    if (FILE* file = std::fopen(port_file.c_str(), "w")) {
      std::fprintf(file, "%d\n", port);
      std::fclose(file);
    }
  }
  std::fprintf(stderr, "fake_worker: listening on 127.0.0.1:%d\n", port);  // before: tests read it
  const std::string line = "LISTENING 127.0.0.1:" + std::to_string(port) + "\n";
  if (::write(ready_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    std::perror("fake_worker: write the ready line");
    return 2;
  }
  ::close(ready_fd);

  const auto exit_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(exit_after_ms);
  for (;;) {
    int timeout = -1;
    if (mode == "ok-then-exit") {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          exit_at - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        std::fprintf(stderr, "fake_worker: exiting as asked\n");
        return 1;
      }
      timeout = static_cast<int>(left.count());
    }
    pollfd pfd{listener, POLLIN, 0};
    if (::poll(&pfd, 1, timeout) > 0) {
      const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn >= 0) ::close(conn);
    }
  }
}
