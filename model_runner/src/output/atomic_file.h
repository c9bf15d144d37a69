// Atomic file output shared by the frame writers: the data goes to a temporary file created next
// to the target (same folder, so rename(2) stays on one filesystem and is atomic) and replaces
// the target only once it is complete and flushed; every failure removes the temporary file.
#pragma once

#include <string>

namespace omni::models::output {

// Owns "<folder>/.<name>.tmp-<pid>-<n>-<random>" until commit(): the destructor closes and
// removes it, so an exception anywhere before the rename leaves nothing behind.
class AtomicFile {
 public:
  // Creates the temporary file (O_EXCL, mode 0666 minus the umask). `what` names the output in
  // errors ("NPY", "PNG", "MP4"); a missing or unwritable folder throws naming it.
  AtomicFile(std::string target, std::string what);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& target() const { return target_; }

  // Writes all of `size` bytes at the current offset (retrying short writes and EINTR).
  void write_all(const void* data, size_t size);
  // fsync and close (a failed close is reported too: NFS and full disks report errors there),
  // keeping the temporary file until publish(); throws naming the target.
  void finish();
  // Renames the finished temporary file over the target; throws naming the target.
  void publish();
  void commit() {
    finish();
    publish();
  }

 private:
  std::string target_, what_, temp_path_;
  int fd_ = -1;
};

}  // namespace omni::models::output
