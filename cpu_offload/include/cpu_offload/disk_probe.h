// The disk's own sequential read speed for a file, to set the disk tier's throughput against.
//
// The disk tier reads units with large direct reads (disk_tier.h); how close it comes to what
// the disk can give is the figure that says whether the tier or the disk limits a run. This
// reads the same file the same way, alone: from its start, in equal blocks, with O_DIRECT where
// the file system takes it (no page cache, so an earlier run's cached pages cannot inflate it).
#pragma once

#include <cstdint>
#include <string>

namespace omni::offload {

struct SequentialRead {
  std::string path;
  uint64_t bytes = 0;   // bytes read (the file's size when it is smaller than asked)
  uint64_t block = 0;   // bytes per read
  double seconds = 0;   // wall time of the reads
  bool direct = false;  // O_DIRECT; false: buffered, after dropping the file's cached pages
  double bytes_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
  std::string to_json() const;
};

// Reads min(`bytes`, file size) bytes of `path` from offset 0 in reads of `block` bytes, a
// multiple of 4096. The default, 9 MiB, is one real-size Qwen3-Omni expert (three 3 MiB bf16
// projections lying next to each other), which the tier reads as one run. Throws omni::Error
// naming the file when it cannot be opened or read, or `block` is not a multiple of 4096.
SequentialRead measure_sequential_read(const std::string& path, uint64_t bytes,
                                       uint64_t block = 9ull << 20);

}  // namespace omni::offload
