#include "sim_device_rules.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"

namespace omni::offload::sim {
namespace {

struct Range {
  size_t offset = 0;
  size_t bytes = 0;
  bool overlaps(size_t o, size_t b) const { return offset < o + b && o < offset + bytes; }
  bool inside(size_t o, size_t b) const { return o <= offset && offset + bytes <= o + b; }
};

bool overlaps(const CopyPart& a, const CopyPart& b) {
  return a.dst < b.dst + b.bytes && b.dst < a.dst + a.bytes;
}

}  // namespace

CopyPart copy_part(const CopyOp& op) {
  return CopyPart{op.dst.bytes_tensor(), op.dst.data() + op.dst_offset, op.src, op.src_offset,
                  op.bytes};
}

// What the rules know of one device buffer. Its state is guarded by the rules' mutex: the
// buffer is freed, bound and copied into from any thread.
class Rules::BufferObserver final : public DeviceBuffer::Observer {
 public:
  BufferObserver(std::shared_ptr<Rules> rules, size_t bytes)
      : rules_(std::move(rules)), bytes_(bytes) {}
  void on_bind(size_t offset, size_t bytes) override { rules_->on_bind(*this, offset, bytes); }
  void on_unbind(size_t offset, size_t bytes) override { rules_->on_unbind(*this, offset, bytes); }
  void on_free() override { rules_->on_free(*this); }

  struct Copied : Range {
    uint64_t id = 0;  // the last copy into this range
  };
  struct Bound : Range {
    uint64_t point = 0;  // compute point of the latest bind
    int count = 0;       // binds not yet unbound
  };
  const std::shared_ptr<Rules> rules_;
  const size_t bytes_;
  std::vector<Copied> copies;  // the last copy into each range (ranges covered later dropped)
  std::vector<Bound> binds;    // ranges bound since their last copy
};

std::shared_ptr<DeviceBuffer::Observer> Rules::observe_buffer(size_t bytes) {
  return std::make_shared<BufferObserver>(shared_from_this(), bytes);
}

Event Rules::record_compute() {
  std::lock_guard<std::mutex> lock(mutex_);
  return Event(std::make_shared<ComputeEvent>(++compute_point_));
}

uint64_t Rules::compute_point_covered(const std::vector<Event>& after) {
  uint64_t point = 0;
  for (const auto& e : after) {
    const Event::Impl* impl = e.impl().get();
    if (impl == nullptr) continue;  // a default event: nothing was recorded
    if (const auto* compute = dynamic_cast<const ComputeEvent*>(impl)) {
      point = std::max(point, compute->point());
    } else if (!dynamic_cast<const CopyEvent*>(impl)) {
      // Not ours: a caller's own event standing for compute in flight. Trusted to cover it.
      return std::numeric_limits<uint64_t>::max();
    }
    // Another copy's event orders this copy after that copy only (the stream is FIFO anyway):
    // it covers no compute.
  }
  return point;
}

Rules::Enqueued Rules::enqueue(const std::vector<CopyOp>& ops, uint64_t after_point,
                               bool poison_now) {
  Enqueued out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.id = ++last_id_;
  Pending copy;
  copy.id = out.id;
  for (const auto& op : ops) {
    copy.parts.push_back(copy_part(op));
    auto* buffer = dynamic_cast<BufferObserver*>(op.dst.observer().get());
    if (buffer == nullptr || buffer->rules_.get() != this) continue;
    for (const auto& bound : buffer->binds) {
      if (!bound.overlaps(op.dst_offset, op.bytes)) continue;
      DeviceRuleViolation v;
      v.buffer_bytes = buffer->bytes_;
      v.offset = op.dst_offset;
      v.bytes = op.bytes;
      v.copy_id = out.id;
      if (bound.count > 0) {
        v.kind = DeviceRuleViolation::Kind::kCopyIntoBoundRange;
        v.message = detail::str_cat(
            "copy #", out.id, " into [", op.dst_offset, ", ", op.dst_offset + op.bytes,
            ") overwrites [", bound.offset, ", ", bound.offset + bound.bytes,
            ") which is still bound as parameters: compute may be reading it. Unbind the unit "
            "and name the compute event recorded after its forward in the copy's `after`");
      } else if (after_point <= bound.point) {
        v.kind = DeviceRuleViolation::Kind::kCopyNotOrderedAfterReaders;
        v.message = detail::str_cat(
            "copy #", out.id, " into [", op.dst_offset, ", ", op.dst_offset + op.bytes,
            ") is not ordered after the compute that read [", bound.offset, ", ",
            bound.offset + bound.bytes, ") (bound at compute point ", bound.point,
            ", the copy's `after` covers up to ", after_point,
            "): on CUDA the copy stream may overwrite it mid-read. Pass the event that "
            "record_compute() returned after that forward");
      } else {
        continue;
      }
      out.violations.push_back(std::move(v));
    }
    // Compute that read these ranges is now behind this copy (or reported): later copies are
    // behind it too.
    auto& binds = buffer->binds;
    binds.erase(std::remove_if(binds.begin(), binds.end(),
                               [&](const BufferObserver::Bound& b) {
                                 return b.count == 0 && b.overlaps(op.dst_offset, op.bytes);
                               }),
                binds.end());
    auto& copies = buffer->copies;
    copies.erase(std::remove_if(copies.begin(), copies.end(),
                                [&](const BufferObserver::Copied& c) {
                                  return c.inside(op.dst_offset, op.bytes);
                                }),
                 copies.end());
    BufferObserver::Copied copied;
    copied.offset = op.dst_offset;
    copied.bytes = op.bytes;
    copied.id = out.id;
    copies.push_back(copied);
  }
  if (poison_now) {
    poison(copy);
    copy.poisoned = true;
  }
  pending_.push_back(std::move(copy));
  for (auto& v : out.violations) {
    v.message = detail::str_cat("device buffer of ", v.buffer_bytes, " bytes: ", v.message);
  }
  return out;
}

void Rules::land(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& copy : pending_) {
    if (copy.id != id) continue;
    if (!copy.poisoned) poison(copy);
    copy.poisoned = true;
    return;
  }
}

void Rules::fail(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& copy : pending_) {
    if (copy.id == id) copy.failed = true;
  }
}

void Rules::settle(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id <= settled_) return;
  settled_ = id;
  // Write the settled copies' bytes in copy order (a later copy into the same range wins, as
  // on the stream), then poison again what a copy still unsettled had poisoned: its range must
  // keep reading as poison until it is settled in turn.
  std::vector<CopyPart> written;
  while (!pending_.empty() && pending_.front().id <= id) {
    Pending& copy = pending_.front();
    if (!copy.failed) {
      for (auto& part : copy.parts) {
        if (part.bytes > 0) std::memcpy(part.dst, part.src.data() + part.src_offset, part.bytes);
        written.push_back(std::move(part));
      }
    }
    pending_.pop_front();
  }
  if (written.empty()) return;
  for (const auto& copy : pending_) {
    if (!copy.poisoned) continue;
    for (const auto& part : copy.parts) {
      const bool clobbered = std::any_of(written.begin(), written.end(),
                                         [&](const CopyPart& w) { return overlaps(w, part); });
      if (clobbered) std::memset(part.dst, kPoison, part.bytes);
    }
  }
  // `written` drops the last references to memory freed while its copy was pending (rule 1
  // kept it alive until now).
}

void Rules::poison(const Pending& copy) {
  for (const auto& part : copy.parts) {
    if (part.bytes > 0) std::memset(part.dst, kPoison, part.bytes);
  }
}

void Rules::on_bind(BufferObserver& buffer, size_t offset, size_t bytes) {
  std::vector<DeviceRuleViolation> violations;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& copied : buffer.copies) {
      if (copied.id <= settled_ || !copied.overlaps(offset, bytes)) continue;
      DeviceRuleViolation v;
      v.kind = DeviceRuleViolation::Kind::kBoundBeforeCopyWaited;
      v.buffer_bytes = buffer.bytes_;
      v.offset = offset;
      v.bytes = bytes;
      v.copy_id = copied.id;
      v.message = detail::str_cat(
          "device buffer of ", buffer.bytes_, " bytes: [", offset, ", ", offset + bytes,
          ") bound as parameters before compute waited for copy #", copied.id, " into [",
          copied.offset, ", ", copied.offset + copied.bytes,
          "): compute would read bytes the copy has not written yet. compute_wait() on the "
          "copy's event first");
      violations.push_back(std::move(v));
    }
    const uint64_t point = ++compute_point_;
    auto it = std::find_if(buffer.binds.begin(), buffer.binds.end(),
                           [&](const auto& b) { return b.offset == offset && b.bytes == bytes; });
    if (it == buffer.binds.end()) {
      BufferObserver::Bound bound;
      bound.offset = offset;
      bound.bytes = bytes;
      it = buffer.binds.insert(buffer.binds.end(), bound);
    }
    it->point = point;
    it->count += 1;
  }
  report(violations);
}

void Rules::on_unbind(BufferObserver& buffer, size_t offset, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& bound : buffer.binds) {
    if (bound.offset == offset && bound.bytes == bytes && bound.count > 0) {
      bound.count -= 1;
      return;
    }
  }
}

void Rules::on_free(BufferObserver& buffer) {
  std::vector<DeviceRuleViolation> violations;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& copied : buffer.copies) {
      if (copied.id <= settled_) continue;
      DeviceRuleViolation v;
      v.kind = DeviceRuleViolation::Kind::kFreedWhileCopyPending;
      v.buffer_bytes = buffer.bytes_;
      v.offset = copied.offset;
      v.bytes = copied.bytes;
      v.copy_id = copied.id;
      v.message = detail::str_cat(
          "device buffer of ", buffer.bytes_, " bytes freed while copy #", copied.id, " into [",
          copied.offset, ", ", copied.offset + copied.bytes,
          ") is pending (not waited for by compute_wait, host_wait or synchronize): on CUDA "
          "the allocator would hand this memory to the next allocation while the copy still "
          "writes it. Wait for the copy's event, or synchronize(), before dropping the buffer");
      violations.push_back(std::move(v));
    }
  }
  report(violations);
}

void Rules::report(const std::vector<DeviceRuleViolation>& violations) const {
  for (const auto& v : violations) {
    if (handler_) {
      handler_(v);
      continue;
    }
    log_message(LogLevel::kError, detail::str_cat("simulated device (OMNI_SIM_STRICT): ",
                                                  to_string(v.kind), ": ", v.message));
    std::abort();
  }
}

}  // namespace omni::offload::sim
