// See atomic_file.h. Same scheme as write_wav's temporary file, shared by the frame writers.
#include "output/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "cpu_offload/check.h"

namespace omni::models::output {

namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string target, std::string what)
    : target_(std::move(target)), what_(std::move(what)) {
  const fs::path path(target_);
  OMNI_CHECK(!path.filename().empty(), "cannot write ", what_, " '", target_, "': not a file name");
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  int last_errno = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string name = "." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                             "-" + std::to_string(counter++) + "-" + std::to_string(device());
    const std::string temp = (folder / name).string();
    fd_ = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      temp_path_ = temp;
      return;
    }
    last_errno = errno;
    if (last_errno != EEXIST) break;
  }
  OMNI_THROW("cannot write ", what_, " '", target_, "': cannot create a file in '", folder.string(),
             "': ", std::strerror(last_errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void AtomicFile::write_all(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      OMNI_THROW("cannot write ", what_, " '", target_,
                 "': ", n < 0 ? std::strerror(errno) : "write returned 0");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::finish() {
  const bool synced = ::fsync(fd_) == 0;
  const int sync_errno = errno;
  const int rc = ::close(fd_);
  fd_ = -1;
  if (!synced || rc != 0) {
    OMNI_THROW("cannot write ", what_, " '", target_,
               "': ", std::strerror(synced ? errno : sync_errno));
  }
}

void AtomicFile::publish() {
  OMNI_CHECK(fd_ < 0 && !temp_path_.empty(), "AtomicFile::publish '", target_, "': not finished");
  if (std::rename(temp_path_.c_str(), target_.c_str()) != 0) {
    OMNI_THROW("cannot write ", what_, " '", target_, "': ", std::strerror(errno));
  }
  temp_path_.clear();
}

}  // namespace omni::models::output
