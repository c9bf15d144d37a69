#include "cpu_offload/disk_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "cpu_offload/check.h"
#include "json_text.h"

namespace omni::offload {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

std::string SequentialRead::to_json() const {
  std::ostringstream out;
  out << "{\"path\": " << json_quoted(path) << ", \"bytes\": " << bytes << ", \"block\": " << block
      << ", \"seconds\": " << seconds << ", \"bytes_per_s\": " << bytes_per_s()
      << ", \"direct\": " << (direct ? "true" : "false") << "}";
  return out.str();
}

SequentialRead measure_sequential_read(const std::string& path, uint64_t bytes, uint64_t block) {
  constexpr uint64_t kAlign = 4096;
  OMNI_CHECK(block > 0 && block % kAlign == 0, path, ": read block of ", block,
             " bytes is not a positive multiple of ", kAlign);
  SequentialRead out;
  out.path = path;
  out.block = block;
  Fd file;
  // Buffered reads, after dropping the file's cached pages: whatever an earlier run left in
  // the page cache would otherwise be read from memory.
  const auto open_buffered = [&] {
    if (file.fd >= 0) ::close(file.fd);
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OMNI_CHECK(file.fd >= 0, path, ": cannot open for reading: ", std::strerror(errno));
    ::posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED);
    out.direct = false;
  };
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  out.direct = file.fd >= 0;
  if (!out.direct) open_buffered();
  struct stat st {};
  OMNI_CHECK(::fstat(file.fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  const uint64_t want = std::min<uint64_t>(bytes, static_cast<uint64_t>(st.st_size));
  void* raw = nullptr;
  OMNI_CHECK(::posix_memalign(&raw, kAlign, block) == 0, path, ": cannot allocate ", block,
             " bytes to read into");
  std::unique_ptr<void, FreeDeleter> buf(raw);
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < want) {
    // Whole blocks even at the end: O_DIRECT wants aligned lengths, and a read past the end of
    // the file is short, not an error.
    const ssize_t got = ::pread(file.fd, buf.get(), block, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EINVAL && out.direct && done == 0) {
      open_buffered();  // opened with O_DIRECT, but the file system refuses direct reads
      continue;
    }
    OMNI_CHECK(got >= 0, path, ": read of ", block, " bytes at offset ", done,
               " failed: ", std::strerror(errno));
    OMNI_CHECK(got > 0, path, ": ends at byte ", done, ", before the ", want, " its size promised");
    done += std::min<uint64_t>(static_cast<uint64_t>(got), want - done);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.bytes = done;
  return out;
}

}  // namespace omni::offload
