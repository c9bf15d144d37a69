// The disk tier: units whose weights stay in the checkpoint's files until they are needed.
//
// When the host memory budget is below the weights that stream (OffloadConfig::
// host_memory_budget_bytes), units are not packed into host slabs. Their tensors' bytes are
// read on demand from the safetensors files themselves (pread, no second copy of the
// checkpoint) into a bounded cache of equal host entries (pinned, so the copy to the device
// is a DMA), by a few reader threads, with read-ahead of the units a backend expects next.
//
// An entry is refilled only after the copy that read it has finished (the event the caller
// hands to release()): refilling earlier would change bytes a copy on the stream has not
// read yet. The simulated device's strict mode makes such a bug visible (a copy's bytes land
// when it is waited for, so a refilled entry would reach the device with the wrong unit).
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cpu_offload/offload_config.h"
#include "cpu_offload/offload_plan.h"
#include "cpu_offload/transfer_engine.h"
#include "cpu_offload/weight_store.h"

namespace omni::offload {

struct DiskTierOptions {
  DiskRead read = DiskRead::kPread;
  size_t cache_bytes = 0;  // host bytes of the entries; must hold min_entries units (pread)
  size_t min_entries = 2;  // fewer entries than this is an error naming the budget
  int reader_threads = 2;
  bool pin = true;
  // pread: read with O_DIRECT where the file system allows it (falls back to buffered reads).
  bool direct = true;
  // Direct reads in place (see DiskTier) when the entries' alignment slack
  // (DiskTier::kInPlaceSlack, counted in cache_bytes) is at most this fraction of an entry
  // and min_entries entries still fit: 1/64 takes a real-size expert (9 MiB) and leaves
  // small units (the tiny test checkpoints) to the bounce buffer.
  double in_place_max_slack = 1.0 / 64;
  std::string label = "disk tier";  // names the cache in errors and logs
  // Tests: runs in a reader thread before it reads `unit` (a slow disk, made deterministic).
  std::function<void(int unit)> before_read;
};

struct DiskTierStats {
  uint64_t acquires = 0;         // units asked for by a copy
  uint64_t hits = 0;             // ... that were in the cache or being read (read-ahead)
  uint64_t misses = 0;           // ... that had to be read then
  uint64_t reads = 0;            // units read from the files
  uint64_t read_bytes = 0;       // bytes read from the files
  uint64_t read_aheads = 0;      // reads issued ahead of need
  uint64_t read_ahead_used = 0;  // ... later acquired
  uint64_t in_place_reads = 0;   // direct reads straight into the entry (no bounce-buffer copy)
  double read_ms = 0;            // reader-thread time spent in pread (summed over threads)
  double wait_ms = 0;            // time acquire() blocked for a read
  double read_wall_ms = 0;       // time at least one read was running
  size_t entries = 0;
  size_t entry_bytes = 0;
  // Bytes read per second of wall time with a read running (the tier's disk throughput).
  double read_bytes_per_s() const {
    return read_wall_ms > 0 ? static_cast<double>(read_bytes) / (read_wall_ms / 1e3) : 0.0;
  }
  std::string to_json() const;
};

// Where an acquired unit's tensors lie in its host entry: `bytes` at `host_offset` of the
// entry's buffer belong at `unit_offset` of the unit's slab layout.
struct HostSpan {
  size_t host_offset = 0;
  size_t unit_offset = 0;
  size_t bytes = 0;
};

struct AcquiredUnit {
  HostBuffer buffer;
  // One span of the whole unit when the entry holds it as its slab would; one per tensor when
  // it holds the file's bytes as they lie (read in place, see DiskTier).
  std::vector<HostSpan> spans;
};

// Reading in place. A unit whose tensors lie in one file, each in the unit's dtype, within a
// span no longer than the unit's slab (a real expert: its three projections side by side; a
// layer without its experts taken out) is read with O_DIRECT straight into its entry, as the
// file lays it out, instead of through a reader's bounce buffer and a copy out of it: one
// user-space copy of every byte read less. Its copy to the device is then one CopyOp per
// tensor from the entry. Other units (converted dtypes, tensors scattered over a file) go
// through the bounce buffer as before. The entries are allocated kInPlaceSlack (12 KiB)
// larger for it (the 4096-byte alignment of the buffer, of the read's start and of its
// length), which counts against the cache's bytes (DiskTierOptions::in_place_max_slack).
class DiskTier {
 public:
  static constexpr size_t kInPlaceSlack = 3 * 4096;

  DiskTier(std::shared_ptr<TransferEngine> engine, DiskTierOptions options);
  // Stops the readers after the reads in flight; waits for the copies the entries feed.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Registers a layout-only unit whose tensors all have an extent in `files` (throws naming
  // the first that has none, or whose extent does not hold the tensor's elements; with mmap,
  // also one stored in another dtype than the unit's). Returns its id. Every unit is
  // registered before the first acquire.
  int add(const OffloadUnit& unit, const TensorFiles& files);
  // Whether every tensor of `unit` has a usable extent in `files` (with mmap: in the unit's
  // dtype, as the copy cannot convert).
  static bool readable(const OffloadUnit& unit, const TensorFiles& files,
                       DiskRead read = DiskRead::kPread);
  // A layout-only unit of `tensors` (views of the checkpoint's mapping) that stays in the
  // files, when it is readable() from them: the views are let go (their pages never touched)
  // and the bytes count as placed for LoadProgress. Null when it is not readable: the caller
  // packs it instead.
  static std::unique_ptr<OffloadUnit> leave_on_disk(
      const std::string& name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
      const DtypeByName* convert, const TensorFiles& files, DiskRead read);

  // The unit's bytes in host memory: from the cache, from a read in flight, or read now
  // (blocks). Every acquire is paired with a release. Throws when the read failed (naming the
  // file), or when every entry is acquired.
  AcquiredUnit acquire(int id);
  // acquire() of several units at once: every read is queued before the first is waited for,
  // so the reader threads work on them side by side (one acquire() after another would read
  // them one at a time). All or nothing: when one read fails, none stays acquired.
  std::vector<AcquiredUnit> acquire_all(const std::vector<int>& ids);
  // The copy enqueued from acquire(id)'s buffer completes at `copy_done`: until then the
  // entry is not refilled.
  void release(int id, Event copy_done);
  // The copies that bring unit `id` to `dst` at `dst_offset`. pread: acquire(id) and one copy
  // from its entry; mmap: one copy per tensor straight from the file's mapping (the page cache
  // reads it in as the copy touches it). Either way, release(id, their event) follows.
  std::vector<CopyOp> copy_ops(int id, const DeviceBuffer& dst, size_t dst_offset);
  // copy_ops() of several units, unit ids[i] to dst_offsets[i], read side by side
  // (acquire_all); release() each after the copy.
  std::vector<CopyOp> copy_ops(const std::vector<int>& ids, const DeviceBuffer& dst,
                               const std::vector<size_t>& dst_offsets);
  // Starts reading `id` if it is neither cached nor being read and an entry is free without
  // waiting; never blocks. Read-aheads wait behind the reads someone waits for (acquire),
  // whenever those were queued.
  void read_ahead(int id);
  // Whether `id`'s bytes are in the cache, read (a copy from acquire() would not wait).
  bool cached(int id) const;

  // Allocates the host entries (pinned) and starts the readers, once every unit is added; else
  // the first acquire does, inside a forward. Idempotent.
  void prepare();
  // Host entries (made by prepare() or the first use); 0 with mmap reads.
  size_t entries() const;
  size_t entry_bytes() const { return entry_bytes_; }
  size_t units() const { return units_.size(); }
  DiskTierStats stats() const;
  void reset_stats();

 private:
  enum class State { kEmpty, kReading, kReady, kFailed };
  struct Entry {
    HostBuffer buffer;
    int unit = -1;
    State state = State::kEmpty;
    int refs = 0;
    Event copy_done;  // the last copy that read it
    uint64_t last_use = 0;
    bool ahead = false;  // filled by read_ahead and not acquired since
    // Where the unit's bytes start in `buffer`: 0, or for a unit read in place the offset at
    // which its file span begins (the buffer's alignment pad plus the span's offset in its
    // first 4096-byte block).
    size_t data_offset = 0;
    std::string error;
  };
  struct Source {
    size_t offset;  // in the entry
    TensorFileExtent extent;
    at::ScalarType dtype;  // in the entry
    int64_t numel;
  };

  void allocate_entries();  // on the first use, once every unit is known
  // An entry that can be refilled now, or -1; with `wait`, waits for the copy reading the
  // least recently used unacquired entry. Called with mu_ held.
  int free_entry(bool wait, std::unique_lock<std::mutex>& lock);
  void start_read(int entry, int unit, bool ahead);  // mu_ held
  // Queues an (entry, unit) read where its kind goes: a read someone waits for before the
  // first queued read-ahead, a read-ahead (the entry's `ahead`) last. mu_ held.
  void enqueue(std::pair<int, int> read);
  // Moves the entry's read, if it has not started, to where its kind goes now. mu_ held.
  void requeue(int entry);
  // The two halves of acquire(), mu_ held. reserve() takes a reference on the entry of `id`,
  // queuing its read if it has none, without waiting for the read (it may wait for a free
  // entry); await() waits for that read and returns the unit's spans, or drops the
  // reference and throws when the read failed.
  int reserve(int id, std::unique_lock<std::mutex>& lock);
  // Drops a reference reserve() took, for an acquire that fails: a read it queued that nobody
  // else waits for becomes a read-ahead. mu_ held.
  void let_go(int entry);
  AcquiredUnit await(int id, int entry, std::unique_lock<std::mutex>& lock);
  void reader_loop();
  // A reader thread's aligned buffer for direct reads.
  struct Bounce {
    std::unique_ptr<uint8_t, void (*)(void*)> data{nullptr, free};
    size_t bytes = 0;
    uint8_t* reserve(size_t n);
  };
  // Reads `unit` into an entry's buffer whose unit bytes start at `data_offset`; no lock held.
  // True when it was read in place with a direct read.
  bool read_unit(int unit, uint8_t* entry, size_t data_offset, Bounce& bounce);
  // An in-place unit's file span with one direct read into `entry` at `data_offset`; false
  // when the file refuses direct reads (the caller reads it buffered, at the same place).
  bool read_in_place(int unit, uint8_t* entry, size_t data_offset);
  // Reads the sources [first, last) of `sources` (sorted by file offset, one file, adjacent)
  // with one O_DIRECT read of their span; false when the file refuses direct reads.
  bool read_direct(const std::vector<const Source*>& run, uint8_t* out, Bounce& bounce);
  // One aligned direct read of the file bytes [begin, end) (begin aligned) into `buf` of
  // `capacity` bytes; false when the file system refuses it (the descriptor is retired).
  bool read_window(int fd, const std::string& path, uint64_t begin, uint64_t end, uint64_t capacity,
                   uint8_t* buf);
  void read_buffered(const Source& source, uint8_t* out);  // pread, converting if needed
  // Bytes a reader's direct-read buffer holds at most (plus two blocks of alignment).
  static constexpr uint64_t kDirectWindow = uint64_t{64} << 20;
  // Direct I/O's alignment of buffers, file offsets and lengths (every common device's
  // logical block size divides it).
  static constexpr uint64_t kBlock = 4096;
  int fd_of(const std::string& path);
  // An O_DIRECT descriptor of `path` (reads bypass the page cache: no kernel copy, and no
  // page cache grown by weights read once); -1 where the file system refuses it.
  int direct_fd_of(const std::string& path);
  // mmap: the file's read-only mapping (made once), as a host buffer that keeps it mapped.
  HostBuffer mapping_of(const std::string& path);

  std::shared_ptr<TransferEngine> engine_;
  DiskTierOptions options_;
  std::vector<std::vector<Source>> units_;
  std::vector<std::string> names_;
  std::vector<size_t> unit_bytes_;
  // Per unit: the file bytes [begin, end) read in place, or begin == end when it is not.
  struct FileSpan {
    uint64_t begin = 0, end = 0;
    bool in_place() const { return end > begin; }
  };
  std::vector<FileSpan> in_place_;
  bool any_in_place_ = false;  // some unit's FileSpan is in place
  size_t entry_bytes_ = 0;
  size_t entry_capacity_ = 0;  // bytes allocated per entry: entry_bytes_ plus in-place slack
  // Whether units read in place (decided with the entries: in_place_possible()).
  bool in_place_on_ = false;
  bool in_place_possible() const;
  bool reads_in_place(int unit) const { return in_place_on_ && in_place_[unit].in_place(); }
  std::vector<Entry> entries_;
  std::vector<int> entry_of_;  // unit -> entry, -1 when not cached

  mutable std::mutex mu_;
  std::condition_variable changed_;  // an entry's state or refs changed; work was queued
  // (entry, unit) reads to do: those someone waits for first, then the read-aheads.
  std::deque<std::pair<int, int>> queue_;
  std::vector<std::thread> readers_;
  bool stopping_ = false;
  uint64_t tick_ = 0;
  int reading_ = 0;  // reads running now
  int64_t busy_since_ns_ = 0;
  DiskTierStats stats_;
  int64_t read_ns_ = 0, wait_ns_ = 0, wall_ns_ = 0;

  std::mutex fd_mu_;
  std::unordered_map<std::string, int> fds_;
  std::unordered_map<std::string, int> direct_fds_;
  std::vector<int> retired_fds_;  // direct descriptors given up, closed with the tier
  std::unordered_map<std::string, HostBuffer> mappings_;
};

// What the host keeps of the streamed weights under config.host_memory_budget_bytes, decided
// from the plan alone (the layerwise backend and the expert cache each ask; same answer):
//   - everything, when there is no budget or the layerwise units and experts fit in it;
//   - else the experts go to disk first (sparse use, the bulk of a MoE model's bytes), their
//     host cache taking what the layerwise units leave;
//   - else the layerwise units go to disk too, with a host cache of (num_gpu_layers + 1 +
//     disk_read_ahead) units, and the experts' cache takes the rest.
// Throws, naming the budget and what it would need, when even that does not fit (or the
// strategy keeps its units on the host and they alone exceed the budget).
struct HostPlacement {
  bool units_on_disk = false;
  size_t unit_cache_bytes = 0;
  bool experts_on_disk = false;
  size_t expert_cache_bytes = 0;
};
HostPlacement place_on_host(const OffloadPlan& plan, const OffloadConfig& config);

}  // namespace omni::offload
