#include "cpu_offload/disk_tier.h"

#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"
#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Reads exactly `bytes` at `offset` of `fd` into `out` (pread may return less than asked).
void pread_all(int fd, const std::string& path, uint64_t offset, uint64_t bytes, uint8_t* out) {
  uint64_t done = 0;
  while (done < bytes) {
    // Linux transfers at most 0x7ffff000 bytes per call.
    const size_t ask = static_cast<size_t>(std::min<uint64_t>(bytes - done, 1ull << 30));
    const ssize_t got = ::pread(fd, out + done, ask, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    OMNI_CHECK(got >= 0, path, ": read of ", bytes, " bytes at offset ", offset,
               " failed: ", std::strerror(errno));
    OMNI_CHECK(got > 0, path, ": ends before byte ", offset + bytes,
               " (the file shrank after it was opened?)");
    done += static_cast<uint64_t>(got);
  }
}

}  // namespace

std::string DiskTierStats::to_json() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "{\"acquires\": " << acquires << ", \"hits\": " << hits << ", \"misses\": " << misses
     << ", \"reads\": " << reads << ", \"read_bytes\": " << read_bytes
     << ", \"read_aheads\": " << read_aheads << ", \"read_ahead_used\": " << read_ahead_used
     << ", \"in_place_reads\": " << in_place_reads << ", \"read_ms\": " << read_ms
     << ", \"read_wall_ms\": " << read_wall_ms << ", \"wait_ms\": " << wait_ms
     << ", \"read_bytes_per_s\": " << read_bytes_per_s() << ", \"entries\": " << entries
     << ", \"entry_bytes\": " << entry_bytes << "}";
  return os.str();
}

DiskTier::DiskTier(std::shared_ptr<TransferEngine> engine, DiskTierOptions options)
    : engine_(std::move(engine)), options_(std::move(options)) {
  OMNI_CHECK(engine_ != nullptr, options_.label, ": no transfer engine");
  OMNI_CHECK(options_.reader_threads >= 1, options_.label, ": reader_threads must be at least 1");
  if (options_.read == DiskRead::kMmap && engine_->kind() == DeviceKind::kCuda) {
    log_warning(options_.label,
                ": mmap reads copy from pageable memory: CUDA stages each copy "
                "before cudaMemcpyAsync returns, so the page faults (disk reads) "
                "run on the compute thread and prefetches do not overlap compute; "
                "pread reads into pinned entries instead");
  }
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  changed_.notify_all();
  for (auto& t : readers_) t.join();
  // Copies still reading an entry must finish before its buffer goes.
  for (auto& e : entries_) {
    try {
      e.copy_done.host_wait();
    } catch (...) {
    }
  }
  for (const auto& [path, fd] : fds_) ::close(fd);
  for (const auto& [path, fd] : direct_fds_) {
    if (fd >= 0) ::close(fd);
  }
  for (int fd : retired_fds_) ::close(fd);
}

bool DiskTier::readable(const OffloadUnit& unit, const TensorFiles& files, DiskRead read) {
  for (const auto& t : unit.tensors()) {
    const auto it = files.find(t.name);
    if (it == files.end()) return false;
    if (read == DiskRead::kMmap && it->second.dtype != t.dtype) return false;
    const int64_t numel = static_cast<int64_t>(t.nbytes / c10::elementSize(t.dtype));
    if (it->second.bytes != static_cast<uint64_t>(numel) * c10::elementSize(it->second.dtype)) {
      return false;
    }
  }
  return true;
}

int DiskTier::add(const OffloadUnit& unit, const TensorFiles& files) {
  OMNI_CHECK(entries_.empty(), options_.label, ": unit '", unit.name(),
             "' added after the cache was in use");
  std::vector<Source> sources;
  for (const auto& t : unit.tensors()) {
    const auto it = files.find(t.name);
    OMNI_CHECK(it != files.end(), options_.label, ": tensor '", t.name, "' of '", unit.name(),
               "' has no place in a checkpoint file to read it from");
    const int64_t numel = static_cast<int64_t>(t.nbytes / c10::elementSize(t.dtype));
    OMNI_CHECK(
        it->second.bytes == static_cast<uint64_t>(numel) * c10::elementSize(it->second.dtype),
        it->second.path, ": tensor '", t.name, "' holds ", it->second.bytes, " bytes, not the ",
        numel, " elements the model has");
    OMNI_CHECK(options_.read != DiskRead::kMmap || it->second.dtype == t.dtype, options_.label,
               ": tensor '", t.name, "' is stored as ", c10::toString(it->second.dtype),
               " but used as ", c10::toString(t.dtype), ": mmap reads cannot convert (use pread)");
    sources.push_back(Source{t.offset, it->second, t.dtype, numel});
    fd_of(it->second.path);  // fails here, at setup, when the file cannot be opened
    if (options_.read == DiskRead::kMmap) mapping_of(it->second.path);
  }
  // In place (see the header): one file, no conversion, a span no longer than the slab.
  FileSpan span;
  if (options_.read == DiskRead::kPread && options_.direct && !sources.empty()) {
    bool ok = true;
    span.begin = sources.front().extent.offset;
    for (const Source& src : sources) {
      ok = ok && src.extent.path == sources.front().extent.path && src.extent.dtype == src.dtype;
      span.begin = std::min<uint64_t>(span.begin, src.extent.offset);
      span.end = std::max<uint64_t>(span.end, src.extent.offset + src.extent.bytes);
    }
    if (!ok || span.end - span.begin > unit.bytes()) span = FileSpan{};
  }
  in_place_.push_back(span);
  any_in_place_ = any_in_place_ || span.in_place();
  units_.push_back(std::move(sources));
  names_.push_back(unit.name());
  unit_bytes_.push_back(unit.bytes());
  entry_bytes_ = std::max(entry_bytes_, unit.bytes());
  entry_of_.push_back(-1);
  return static_cast<int>(units_.size()) - 1;
}

int DiskTier::fd_of(const std::string& path) {
  std::lock_guard<std::mutex> lock(fd_mu_);
  const auto it = fds_.find(path);
  if (it != fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OMNI_CHECK(fd >= 0, path, ": cannot open for reading: ", std::strerror(errno));
  fds_.emplace(path, fd);
  return fd;
}

std::unique_ptr<OffloadUnit> DiskTier::leave_on_disk(
    const std::string& name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const DtypeByName* convert, const TensorFiles& files, DiskRead read) {
  auto unit = OffloadUnit::layout_only(name, tensors, convert);
  if (!readable(*unit, files, read)) return nullptr;
  for (const auto& named : tensors) LoadProgress::add(named.second.nbytes());
  unit->unbind();
  return unit;
}

HostBuffer DiskTier::mapping_of(const std::string& path) {
  const int fd = fd_of(path);
  std::lock_guard<std::mutex> lock(fd_mu_);
  const auto it = mappings_.find(path);
  if (it != mappings_.end()) return it->second;
  struct stat st {};
  OMNI_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  OMNI_CHECK(map != MAP_FAILED, path, ": cannot map ", size, " bytes: ", std::strerror(errno));
  // Pageable memory as far as the device is concerned: copies from it are staged.
  HostBuffer buffer(std::shared_ptr<uint8_t>(static_cast<uint8_t*>(map),
                                             [size](uint8_t* p) { ::munmap(p, size); }),
                    size, /*pinned=*/false);
  mappings_.emplace(path, buffer);
  return buffer;
}

std::vector<CopyOp> DiskTier::copy_ops(int id, const DeviceBuffer& dst, size_t dst_offset) {
  return copy_ops(std::vector<int>{id}, dst, {dst_offset});
}

std::vector<CopyOp> DiskTier::copy_ops(const std::vector<int>& ids, const DeviceBuffer& dst,
                                       const std::vector<size_t>& dst_offsets) {
  OMNI_CHECK(ids.size() == dst_offsets.size(), options_.label, ": ", ids.size(), " units but ",
             dst_offsets.size(), " destinations");
  std::vector<CopyOp> ops;
  if (options_.read == DiskRead::kPread) {
    const std::vector<AcquiredUnit> host = acquire_all(ids);  // checks the ids
    for (size_t i = 0; i < ids.size(); ++i) {
      for (const HostSpan& span : host[i].spans) {
        ops.push_back(CopyOp{host[i].buffer, span.host_offset, dst,
                             dst_offsets[i] + span.unit_offset, span.bytes});
      }
    }
    return ops;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    OMNI_CHECK(ids[i] >= 0 && static_cast<size_t>(ids[i]) < units_.size(), options_.label,
               ": no unit ", ids[i]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.acquires += 1;
      stats_.reads += 1;
      stats_.read_bytes +=
          unit_bytes_[ids[i]];  // what the copies touch; the page cache may hold it
    }
    for (const Source& s : units_[ids[i]]) {
      ops.push_back(CopyOp{mapping_of(s.extent.path), static_cast<size_t>(s.extent.offset), dst,
                           dst_offsets[i] + s.offset, static_cast<size_t>(s.extent.bytes)});
    }
  }
  return ops;
}

bool DiskTier::in_place_possible() const {
  // Constant time: entries() asks it, and the expert cache asks entries() on every ensure.
  if (entry_bytes_ == 0 || !any_in_place_) return false;
  const size_t capacity = entry_bytes_ + kInPlaceSlack;
  return static_cast<double>(kInPlaceSlack) <=
             options_.in_place_max_slack * static_cast<double>(entry_bytes_) &&
         options_.cache_bytes / capacity >= std::min(units_.size(), options_.min_entries);
}

size_t DiskTier::entries() const {
  if (options_.read == DiskRead::kMmap || entry_bytes_ == 0) return 0;
  const size_t capacity = entry_bytes_ + (in_place_possible() ? kInPlaceSlack : 0);
  return std::min(units_.size(), options_.cache_bytes / capacity);
}

void DiskTier::prepare() {
  std::lock_guard<std::mutex> lock(mu_);
  allocate_entries();
}

void DiskTier::allocate_entries() {
  if (options_.read == DiskRead::kMmap) return;  // the page cache is the cache
  if (!entries_.empty() || units_.empty()) return;
  const size_t count = entries();
  OMNI_CHECK(count >= std::min(units_.size(), options_.min_entries), options_.label, ": ",
             options_.cache_bytes, " bytes of host cache hold ", count, " unit(s) of ",
             entry_bytes_, " bytes; at least ", options_.min_entries, " are needed (",
             options_.min_entries * entry_bytes_,
             " bytes): raise the host memory budget (--host-memory-budget)");
  entries_.resize(count);
  in_place_on_ = in_place_possible();
  entry_capacity_ = entry_bytes_ + (in_place_on_ ? kInPlaceSlack : 0);
  for (auto& e : entries_) {
    e.buffer = engine_->allocate_host(entry_capacity_, options_.pin);
    // A pageable entry would make every copy from it synchronous on CUDA (staged by the
    // driver), so read-ahead could never overlap compute.
    OMNI_CHECK(!options_.pin || e.buffer.pinned(), options_.label, ": cannot pin ", entry_bytes_,
               " bytes of host memory for its cache (", count,
               " entries): free host memory or raise the locked-memory limit (ulimit -l), lower "
               "--host-memory-budget, or turn pinning off (--no-cpu-offload-pin-memory)");
  }
  stats_.entries = count;
  stats_.entry_bytes = entry_bytes_;
  for (int i = 0; i < options_.reader_threads; ++i)
    readers_.emplace_back([this] { reader_loop(); });
  log_info(options_.label, ": ", units_.size(), " units read from the checkpoint on demand, ",
           count, " host entries of ", entry_bytes_, " bytes, ", options_.reader_threads,
           " reader threads", in_place_on_ ? ", direct reads in place" : "");
}

int DiskTier::free_entry(bool wait, std::unique_lock<std::mutex>& lock) {
  int best = -1;
  bool reading = false;  // an unacquired entry is being read (a read-ahead)
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if ((e.state == State::kEmpty || e.state == State::kFailed) && e.refs == 0) {
      return static_cast<int>(i);
    }
    if (e.state == State::kReading && e.refs == 0) reading = true;
    if (e.state != State::kReady || e.refs > 0) continue;
    if (best < 0 || e.last_use < entries_[best].last_use) best = static_cast<int>(i);
  }
  if (best < 0) {
    if (!wait || !reading) return -1;
    // Every entry not in use by a copy is being read ahead (a slow disk): the first to finish
    // can be taken.
    changed_.wait(lock);
    return free_entry(wait, lock);
  }
  if (entries_[best].copy_done.ready()) return best;
  if (!wait) {
    // Any unacquired entry whose copy is over will do for a read-ahead.
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.state == State::kReady && e.refs == 0 && e.copy_done.ready()) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  // The least recently used entry's copy is still running: wait for it (rarely: a copy of one
  // unit is faster than a read of the next).
  const Event done = entries_[best].copy_done;
  const int unit = entries_[best].unit;
  lock.unlock();
  try {
    done.host_wait();
  } catch (...) {
    lock.lock();  // the caller's rollback changes entries: under the lock, as everywhere
    throw;
  }
  lock.lock();
  // Someone may have taken it meanwhile (and perhaps a newer copy reads it now): look again.
  const Entry& again = entries_[best];
  if (again.unit == unit && again.refs == 0 && again.state == State::kReady &&
      (again.copy_done.impl() == done.impl() || again.copy_done.ready())) {
    return best;
  }
  return free_entry(wait, lock);
}

void DiskTier::start_read(int entry, int unit, bool ahead) {
  Entry& e = entries_[entry];
  if (e.unit >= 0 && entry_of_[e.unit] == entry) entry_of_[e.unit] = -1;
  e.unit = unit;
  e.state = State::kReading;
  e.refs = 0;
  e.copy_done = Event();
  e.ahead = ahead;
  e.error.clear();
  e.data_offset = 0;
  if (reads_in_place(unit)) {
    const auto base = reinterpret_cast<uintptr_t>(e.buffer.data());
    const size_t pad = static_cast<size_t>((kBlock - base % kBlock) % kBlock);
    e.data_offset = pad + static_cast<size_t>(in_place_[unit].begin % kBlock);
  }
  e.last_use = ++tick_;
  entry_of_[unit] = entry;
  enqueue({entry, unit});
  changed_.notify_all();
}

void DiskTier::enqueue(std::pair<int, int> read) {
  // A read someone waits for goes before the read-aheads still queued: a speculative read
  // must not delay the reads the model is stalled on (it may read a unit nobody asks for).
  if (entries_[read.first].ahead) {
    queue_.push_back(read);
    return;
  }
  queue_.insert(std::find_if(queue_.begin(), queue_.end(),
                             [&](const std::pair<int, int>& q) { return entries_[q.first].ahead; }),
                read);
}

void DiskTier::requeue(int entry) {
  const auto queued = std::find_if(queue_.begin(), queue_.end(),
                                   [&](const std::pair<int, int>& q) { return q.first == entry; });
  if (queued == queue_.end()) return;  // being read already
  const auto read = *queued;
  queue_.erase(queued);
  enqueue(read);
}

AcquiredUnit DiskTier::acquire(int id) { return std::move(acquire_all({id}).front()); }

std::vector<AcquiredUnit> DiskTier::acquire_all(const std::vector<int>& ids) {
  for (int id : ids) {
    OMNI_CHECK(id >= 0 && static_cast<size_t>(id) < units_.size(), options_.label, ": no unit ",
               id);
  }
  OMNI_CHECK(options_.read == DiskRead::kPread, options_.label,
             ": acquire() reads into host entries, which mmap reads do not have (copy_ops)");
  std::unique_lock<std::mutex> lock(mu_);
  allocate_entries();
  // Entries, in the order of ids. The units held already are taken first: a miss's free
  // entry must not be one that a later unit of the same call would hit.
  std::vector<int> taken(ids.size(), -1);
  try {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < ids.size(); ++i) {
        const bool held = entry_of_[ids[i]] >= 0;
        if (taken[i] < 0 && (pass == 1 || held)) taken[i] = reserve(ids[i], lock);
      }
    }
  } catch (...) {
    for (int entry : taken) {
      if (entry >= 0) let_go(entry);
    }
    throw;
  }
  std::vector<AcquiredUnit> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      out.push_back(await(ids[i], taken[i], lock));
    } catch (...) {
      // await() dropped the failed one's reference; no copy reads the others yet.
      for (size_t j = 0; j < taken.size(); ++j) {
        if (j != i) let_go(taken[j]);
      }
      throw;
    }
  }
  return out;
}

void DiskTier::let_go(int entry) {
  Entry& e = entries_[entry];
  e.refs -= 1;
  if (e.refs > 0 || e.state != State::kReading || e.ahead) return;
  // A read nobody waits for any more is a read-ahead now: it goes behind the reads someone
  // waits for, and counts against the entries read-aheads may take.
  e.ahead = true;
  requeue(entry);
}

int DiskTier::reserve(int id, std::unique_lock<std::mutex>& lock) {
  stats_.acquires += 1;
  int entry = entry_of_[id];
  if (entry < 0) {
    const int free = free_entry(/*wait=*/true, lock);  // may let go of the lock meanwhile...
    entry = entry_of_[id];  // ... and another thread may have started reading `id`
    if (entry < 0) {
      OMNI_CHECK(free >= 0, options_.label, ": all ", entries_.size(),
                 " host entries are in use by copies being set up; '", names_[id],
                 "' cannot be read (raise the host memory budget)");
      stats_.misses += 1;
      start_read(free, id, /*ahead=*/false);
      entry = free;
    } else {
      stats_.hits += 1;
    }
  } else if (entries_[entry].state == State::kFailed && entries_[entry].refs == 0) {
    start_read(entry, id, /*ahead=*/false);  // a read-ahead failed: try once more, now
    stats_.misses += 1;
  } else {
    stats_.hits += 1;
  }
  Entry& e = entries_[entry];
  if (e.ahead) {
    stats_.read_ahead_used += 1;
    e.ahead = false;
    requeue(entry);  // still queued: now someone waits for it, before the read-aheads
  }
  e.refs += 1;  // not refilled while we wait for it
  return entry;
}

AcquiredUnit DiskTier::await(int id, int entry, std::unique_lock<std::mutex>& lock) {
  Entry& e = entries_[entry];
  if (e.state == State::kReading) {
    const int64_t start = now_ns();
    changed_.wait(lock, [&] { return e.state != State::kReading; });
    wait_ns_ += now_ns() - start;
  }
  e.last_use = ++tick_;
  if (e.state == State::kFailed) {
    e.refs -= 1;
    entry_of_[id] = -1;
    const std::string error = e.error;
    e.unit = -1;
    OMNI_THROW(options_.label, ": reading '", names_[id], "' failed: ", error);
  }
  AcquiredUnit out{e.buffer, {}};
  if (!reads_in_place(id)) {
    out.spans.push_back(HostSpan{0, 0, unit_bytes_[id]});
    return out;
  }
  for (const Source& src : units_[id]) {
    out.spans.push_back(
        HostSpan{e.data_offset + static_cast<size_t>(src.extent.offset - in_place_[id].begin),
                 src.offset, static_cast<size_t>(src.extent.bytes)});
  }
  return out;
}

void DiskTier::release(int id, Event copy_done) {
  if (options_.read == DiskRead::kMmap) return;  // the mapping outlives every copy
  std::lock_guard<std::mutex> lock(mu_);
  const int entry = entry_of_.at(id);
  OMNI_CHECK(entry >= 0 && entries_[entry].refs > 0, options_.label, ": '", names_[id],
             "' released without an acquire");
  Entry& e = entries_[entry];
  e.refs -= 1;
  // An error path releases with no event: the entry's last copy (if any) still counts.
  if (copy_done.impl()) e.copy_done = std::move(copy_done);
}

bool DiskTier::cached(int id) const {
  if (options_.read == DiskRead::kMmap) return true;  // as far as we know: the OS decides
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || static_cast<size_t>(id) >= units_.size() || entry_of_[id] < 0) return false;
  return entries_[entry_of_[id]].state == State::kReady;
}

void DiskTier::read_ahead(int id) {
  if (options_.read == DiskRead::kMmap) return;
  if (id < 0 || static_cast<size_t>(id) >= units_.size()) return;
  std::unique_lock<std::mutex> lock(mu_);
  allocate_entries();
  if (entry_of_[id] >= 0) return;
  // Read-aheads not acquired yet leave at least min_entries entries to the reads of units
  // needed now.
  size_t ahead = 0;
  for (const Entry& e : entries_) ahead += e.ahead && e.refs == 0 ? 1 : 0;
  if (ahead + std::max<size_t>(options_.min_entries, 1) >= entries_.size()) return;
  const int entry = free_entry(/*wait=*/false, lock);
  if (entry < 0) return;
  stats_.read_aheads += 1;
  start_read(entry, id, /*ahead=*/true);
}

void DiskTier::reader_loop() {
  Bounce bounce;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const auto [entry, unit] = queue_.front();
    queue_.pop_front();
    uint8_t* out = entries_[entry].buffer.data();
    const size_t data_offset = entries_[entry].data_offset;
    if (reading_++ == 0) busy_since_ns_ = now_ns();
    lock.unlock();
    const int64_t start = now_ns();
    std::string error;
    bool in_place = false;
    try {
      if (options_.before_read) options_.before_read(unit);
      in_place = read_unit(unit, out, data_offset, bounce);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    const int64_t took = now_ns() - start;
    lock.lock();
    if (--reading_ == 0) wall_ns_ += now_ns() - busy_since_ns_;
    read_ns_ += took;
    Entry& e = entries_[entry];
    if (error.empty()) {
      e.state = State::kReady;
      stats_.reads += 1;
      stats_.read_bytes += unit_bytes_[unit];
      stats_.in_place_reads += in_place ? 1 : 0;
    } else {
      e.state = State::kFailed;
      e.error = error;
      log_warning(options_.label, ": ", error);
    }
    changed_.notify_all();
  }
}

uint8_t* DiskTier::Bounce::reserve(size_t n) {
  if (n <= bytes) return data.get();
  void* p = nullptr;
  OMNI_CHECK(::posix_memalign(&p, 4096, n) == 0, "disk tier: cannot allocate ", n,
             " bytes for a direct read");
  data.reset(static_cast<uint8_t*>(p));
  bytes = n;
  return data.get();
}

int DiskTier::direct_fd_of(const std::string& path) {
  std::lock_guard<std::mutex> lock(fd_mu_);
  const auto it = direct_fds_.find(path);
  if (it != direct_fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0)
    log_info(options_.label, ": ", path, " refuses direct reads (", std::strerror(errno),
             "): reading through the page cache");
  direct_fds_.emplace(path, fd);
  return fd;
}

// Direct I/O wants the file offset, the length and the buffer aligned to the logical block
// size; 4096 covers every common device. The span of the run is read into an aligned bounce
// buffer and each tensor copied (or converted) out of it: a user-space copy instead of the
// kernel's copy out of the page cache, and the page cache is left alone. The bounce buffer
// holds one window (kDirectWindow + two blocks): runs are cut to fit one window (read_unit),
// and a single tensor larger than a window, stored in the unit's dtype, is read window by
// window, so a reader's buffer never grows to a layer's size outside the host budget.
bool DiskTier::read_direct(const std::vector<const Source*>& run, uint8_t* out, Bounce& bounce) {
  const std::string& path = run.front()->extent.path;
  const int fd = direct_fd_of(path);
  if (fd < 0) return false;
  const uint64_t begin = run.front()->extent.offset / kBlock * kBlock;
  uint64_t end = 0;
  for (const Source* s : run) end = std::max(end, s->extent.offset + s->extent.bytes);
  const uint64_t span = (end - begin + kBlock - 1) / kBlock * kBlock;
  const uint64_t window = std::min<uint64_t>(span, kDirectWindow + 2 * kBlock);
  uint8_t* buf = bounce.reserve(static_cast<size_t>(window));
  for (uint64_t at = begin; at < end; at += window) {
    const uint64_t stop = std::min(at + window, end);  // file bytes of this window
    if (!read_window(fd, path, at, stop, window, buf)) return false;
    for (const Source* s : run) {
      const uint64_t from = std::max(at, s->extent.offset);
      const uint64_t to = std::min(stop, s->extent.offset + s->extent.bytes);
      if (from >= to) continue;
      const uint8_t* src = buf + (from - at);
      if (s->extent.dtype == s->dtype) {
        std::memcpy(out + s->offset + (from - s->extent.offset), src, to - from);
        continue;
      }
      // Converted: read_unit keeps such a tensor inside one window.
      OMNI_CHECK(from == s->extent.offset && to == s->extent.offset + s->extent.bytes,
                 options_.label, ": tensor at offset ", s->extent.offset,
                 " to convert spans two read windows");
      at::from_blob(out + s->offset, {s->numel}, at::TensorOptions(s->dtype))
          .copy_(at::from_blob(const_cast<uint8_t*>(src), {s->numel},
                               at::TensorOptions(s->extent.dtype)));
    }
  }
  return true;
}

bool DiskTier::read_window(int fd, const std::string& path, uint64_t begin, uint64_t end,
                           uint64_t capacity, uint8_t* buf) {
  const uint64_t span = std::min(capacity, (end - begin + kBlock - 1) / kBlock * kBlock);
  uint64_t done = 0;
  while (done < end - begin) {
    const size_t ask = static_cast<size_t>(std::min<uint64_t>(span - done, 1ull << 30));
    const ssize_t got = ::pread(fd, buf + done, ask, static_cast<off_t>(begin + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EINVAL && done == 0) {
      // Alignment this file system does not take: buffered from now. The descriptor is kept
      // open until the tier goes (another reader may be using it right now; closing it could
      // let a new open reuse the number under that reader).
      std::lock_guard<std::mutex> lock(fd_mu_);
      if (direct_fds_[path] == fd) {
        direct_fds_[path] = -1;
        retired_fds_.push_back(fd);
      }
      return false;
    }
    OMNI_CHECK(got >= 0, path, ": read of ", span, " bytes at offset ", begin,
               " failed: ", std::strerror(errno));
    OMNI_CHECK(got > 0, path, ": ends before byte ", end,
               " (the file shrank after it was opened?)");
    done += static_cast<uint64_t>(got);  // the last block may be short: the end of the file
  }
  return true;
}

bool DiskTier::read_in_place(int unit, uint8_t* entry, size_t data_offset) {
  const FileSpan& span = in_place_[unit];
  const std::string& path = units_[unit].front().extent.path;
  const int fd = direct_fd_of(path);
  if (fd < 0) return false;
  const uint64_t begin = span.begin / kBlock * kBlock;
  const size_t at = data_offset - static_cast<size_t>(span.begin - begin);  // 4096-aligned
  return read_window(fd, path, begin, span.end, entry_capacity_ - at, entry + at);
}

bool DiskTier::read_unit(int unit, uint8_t* entry, size_t data_offset, Bounce& bounce) {
  if (reads_in_place(unit)) {
    if (read_in_place(unit, entry, data_offset)) return true;
    // The file refuses direct reads: each tensor read buffered, to where the direct read would
    // have put it (acquire's spans point there).
    for (const Source& src : units_[unit]) {
      pread_all(fd_of(src.extent.path), src.extent.path, src.extent.offset, src.extent.bytes,
                entry + data_offset + (src.extent.offset - in_place_[unit].begin));
    }
    return false;
  }
  uint8_t* out = entry + data_offset;
  if (options_.direct) {
    // Runs of tensors that lie next to each other in one file (an expert's three projections):
    // one read each.
    std::vector<const Source*> sorted;
    for (const Source& s : units_[unit]) sorted.push_back(&s);
    std::sort(sorted.begin(), sorted.end(), [](const Source* a, const Source* b) {
      return a->extent.path != b->extent.path ? a->extent.path < b->extent.path
                                              : a->extent.offset < b->extent.offset;
    });
    bool all_direct = true;
    std::vector<const Source*> run;
    auto flush = [&] {
      if (!run.empty() && !read_direct(run, out, bounce)) all_direct = false;
      run.clear();
    };
    std::vector<const Source*> buffered;  // larger than a window and converted
    for (const Source* s : sorted) {
      if (s->extent.bytes > kDirectWindow && s->extent.dtype != s->dtype) {
        buffered.push_back(s);
        continue;
      }
      if (!run.empty()) {
        const Source* last = run.back();
        const bool adjacent = last->extent.path == s->extent.path &&
                              s->extent.offset <= last->extent.offset + last->extent.bytes + 65536;
        const bool fits =
            s->extent.offset + s->extent.bytes - run.front()->extent.offset <= kDirectWindow;
        if (!adjacent || !fits) flush();
      }
      if (!all_direct) break;
      run.push_back(s);
    }
    flush();
    if (all_direct) {
      for (const Source* s : buffered) read_buffered(*s, out);
      return false;
    }
  }
  for (const Source& s : units_[unit]) read_buffered(s, out);
  return false;
}

void DiskTier::read_buffered(const Source& s, uint8_t* out) {
  const int fd = fd_of(s.extent.path);
  if (s.extent.dtype == s.dtype) {
    pread_all(fd, s.extent.path, s.extent.offset, s.extent.bytes, out + s.offset);
    return;
  }
  // Converted while reading: through a temporary of this tensor only.
  std::vector<uint8_t> raw(s.extent.bytes);
  pread_all(fd, s.extent.path, s.extent.offset, s.extent.bytes, raw.data());
  at::from_blob(out + s.offset, {s.numel}, at::TensorOptions(s.dtype))
      .copy_(at::from_blob(raw.data(), {s.numel}, at::TensorOptions(s.extent.dtype)));
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = stats_;
  s.read_ms = static_cast<double>(read_ns_) / 1e6;
  s.wait_ms = static_cast<double>(wait_ns_) / 1e6;
  int64_t wall = wall_ns_;
  if (reading_ > 0) wall += now_ns() - busy_since_ns_;
  s.read_wall_ms = static_cast<double>(wall) / 1e6;
  return s;
}

void DiskTier::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats fresh;
  fresh.entries = stats_.entries;
  fresh.entry_bytes = stats_.entry_bytes;
  stats_ = fresh;
  read_ns_ = wait_ns_ = wall_ns_ = 0;
  if (reading_ > 0) busy_since_ns_ = now_ns();
}

HostPlacement place_on_host(const OffloadPlan& plan, const OffloadConfig& config) {
  HostPlacement out;
  const size_t budget = config.host_memory_budget_bytes;
  size_t unit_bytes = 0, max_unit = 0, max_expert = 0;
  for (const auto& u : plan.units) {
    unit_bytes += u.bytes + kTensorAlignment * u.tensor_names.size();
    max_unit = std::max(max_unit, u.bytes + kTensorAlignment * u.tensor_names.size());
  }
  for (const auto& g : plan.groups) {
    for (const auto& u : g.units) unit_bytes += u.bytes + kTensorAlignment * u.tensor_names.size();
  }
  size_t expert_bytes = 0;
  for (const auto& e : plan.experts) {
    expert_bytes += e.bytes + kTensorAlignment * e.tensor_names.size();
    max_expert = std::max(max_expert, e.bytes + kTensorAlignment * e.tensor_names.size());
  }
  if (budget == 0 || unit_bytes + expert_bytes <= budget) return out;
  const size_t min_experts = 2 * max_expert;
  if (!plan.experts.empty() && unit_bytes + min_experts <= budget) {
    out.experts_on_disk = true;
    out.expert_cache_bytes = budget - unit_bytes;
    return out;
  }
  OMNI_CHECK(plan.strategy == Strategy::kLayerwise, "host memory budget ", budget,
             " bytes is below the ", unit_bytes + min_experts, " bytes that ",
             to_string(plan.strategy), " offload keeps on the host (", unit_bytes,
             " bytes of units, plus two experts' cache entries if experts are offloaded): raise "
             "--host-memory-budget, or stream layers (layerwise offload), which can read them "
             "from disk");
  const size_t min_units =
      static_cast<size_t>(config.num_gpu_layers + 1 + config.disk_read_ahead) * max_unit;
  // A model with few layers: the tier's least cache holds every unit, so reading them from disk
  // saves nothing and the need is the units themselves.
  OMNI_CHECK(min_units < unit_bytes, "host memory budget ", budget, " bytes is below the ",
             unit_bytes + (plan.experts.empty() ? 0 : min_experts), " bytes of the streamed units",
             plan.experts.empty() ? "" : " plus two experts' cache entries",
             " (the disk tier would need more: ", min_units, " bytes for ",
             config.num_gpu_layers + 1 + config.disk_read_ahead, " units of ", max_unit,
             " bytes): raise --host-memory-budget");
  OMNI_CHECK(
      min_units + min_experts <= budget, "host memory budget ", budget, " bytes is below the ",
      min_units + min_experts, " bytes the disk tier needs at least (",
      config.num_gpu_layers + 1 + config.disk_read_ahead, " layer units of ", max_unit, " bytes",
      plan.experts.empty() ? "" : " plus two experts", "): raise --host-memory-budget");
  out.units_on_disk = true;
  if (plan.experts.empty()) {
    out.unit_cache_bytes = budget;
    return out;
  }
  out.unit_cache_bytes = min_units;
  out.experts_on_disk = true;
  out.expert_cache_bytes = budget - min_units;
  return out;
}

}  // namespace omni::offload
