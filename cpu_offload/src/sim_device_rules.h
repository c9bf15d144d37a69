// The simulated device's strict mode: CUDA's ordering rules for device memory, checked.
//
// On the CPU a backend gets away with what breaks on a GPU: memcpy is fast, so compute that
// reads a slot before waiting for its copy usually sees the right bytes, and a freed buffer
// is just memory nobody else wants yet. These rules make such code fail on the CPU too.
//
// Vocabulary. A copy is *settled* once the host or compute is ordered after it: compute_wait
// or host_wait on its event (or on a later copy's: the copy stream is FIFO), ready() having
// returned true, or synchronize(). Mere completion does not count: on CUDA nobody knows a
// copy has completed until they ask, so relying on it is a race that happens to be won.
//
// The rules (each breach is a DeviceRuleViolation, see transfer_engine.h):
//   1. A buffer may be freed (its last handle dropped) only when every copy into it is settled.
//      CUDA's caching allocator hands a freed block to the next allocation on the compute
//      stream at once; only compute that is ordered after the copy (compute_wait) or a host
//      that saw it end (a sync) makes that reuse safe. (Our CUDA engine also record_stream()s
//      each destination as a second line of defence; the rule is the engine's contract.)
//   2. A range may be bound as parameters (OffloadUnit::bind, i.e. compute reads it) only when
//      every copy into it is settled.
//   3. A copy may not be enqueued into a range that is still bound, and a copy into a range
//      that was bound since its previous copy must name, in `after`, a compute event recorded
//      after that bind (the compute that read it), so the copy stream does not overwrite the
//      range while compute reads it. Compute on the simulated device is synchronous, so the
//      event cannot be late; what is checked is that the right event was named.
//   4. Reads that no rule sees (a forward through a view the backend kept, a test peeking at
//      the bytes) are caught by the data: a copy's destination reads as 0xFF (NaN in every
//      float format) until the copy is settled, and then its real bytes are written, in copy
//      order (by the thread that settles it: the copy thread itself only poisons). A read
//      before the wait reads NaN, whatever the timing. The poison is written as early as it
//      is safe: at enqueue when the copy stream has nothing to wait for (the simulated
//      device's compute events are always complete), else when the copy thread reaches the
//      copy. Fresh buffers read as poison too, not as the bytes of the buffer freed before.
//      Timings in strict mode are not representative: the bytes move on the waiting thread.
// Outputs of a correct backend stay bitwise equal: every byte it reads has been settled.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_offload/transfer_engine.h"

namespace omni::offload::sim {

// What unwritten device memory reads as in strict mode: NaN in fp32, fp16 and bf16, -1 in
// signed integers.
constexpr uint8_t kPoison = 0xFF;

// One host-to-device copy as the copy thread and the rules hold it: the destination's memory
// (its tensor keeps it alive), not its DeviceBuffer handle, so a copy in flight never delays
// the free that rule 1 judges.
struct CopyPart {
  at::Tensor dst_memory;
  uint8_t* dst = nullptr;
  HostBuffer src;
  size_t src_offset = 0;
  size_t bytes = 0;
};
CopyPart copy_part(const CopyOp& op);

// An event on the simulated compute stream: compute is synchronous, so it is always complete;
// it carries its point in the order of compute operations (binds and record_compute), which
// rule 3 compares.
class ComputeEvent final : public Event::Impl {
 public:
  explicit ComputeEvent(uint64_t point) : point_(point) {}
  bool ready() const override { return true; }
  void host_wait() const override {}
  uint64_t point() const { return point_; }

 private:
  uint64_t point_;
};

class Rules : public std::enable_shared_from_this<Rules> {
 public:
  // `handler` receives each violation; unset, a violation is logged and aborts the process.
  explicit Rules(DeviceRuleViolationHandler handler) : handler_(std::move(handler)) {}

  // The observer to attach to a new device buffer of `bytes` (rules 1 to 3 for it).
  std::shared_ptr<DeviceBuffer::Observer> observe_buffer(size_t bytes);

  // A compute event covering everything computed so far (record_compute).
  Event record_compute();
  // The latest compute point that `after` orders a copy behind: 0 for none, the maximum for
  // events from elsewhere (a test's stand-in for compute in flight: trusted to cover it).
  static uint64_t compute_point_covered(const std::vector<Event>& after);

  struct Enqueued {
    uint64_t id = 0;
    std::vector<DeviceRuleViolation> violations;  // to report() once the caller's locks are off
  };
  // A copy was validated and is about to be queued, ordered after compute point
  // `after_point`. Checks rule 3, numbers the copy (ids must follow the queue's order: call it
  // under the queue's lock) and keeps its parts until it is settled. With `poison_now`, its
  // destinations read as poison from now on.
  Enqueued enqueue(const std::vector<CopyOp>& ops, uint64_t after_point, bool poison_now);
  // The copy thread ran copy `id` (its events waited for): its destinations read as poison
  // until it is settled.
  void land(uint64_t id);
  // Copy `id` failed (an event it waited for failed): it will never write its bytes.
  void fail(uint64_t id);
  // The host or compute is now ordered after copy `id` and every earlier one: their bytes are
  // written (rule 4) and their destinations may be read and freed.
  void settle(uint64_t id);

  void report(const std::vector<DeviceRuleViolation>& violations) const;

 private:
  class BufferObserver;
  struct Pending {
    uint64_t id = 0;
    std::vector<CopyPart> parts;
    bool poisoned = false;
    bool failed = false;
  };

  void on_bind(BufferObserver& buffer, size_t offset, size_t bytes);
  void on_unbind(BufferObserver& buffer, size_t offset, size_t bytes);
  void on_free(BufferObserver& buffer);
  static void poison(const Pending& copy);

  const DeviceRuleViolationHandler handler_;
  std::mutex mutex_;  // guards everything below, every BufferObserver's state and the poisoning
  uint64_t last_id_ = 0;
  uint64_t settled_ = 0;  // every copy up to this id is settled
  uint64_t compute_point_ = 0;
  std::deque<Pending> pending_;  // copies not settled yet, in id order
};

// The event of a copy on the simulated device: completes when the copy thread has run it.
// With rules (strict mode), observing it (ready() true, host_wait) settles the copy.
class CopyEvent final : public Event::Impl {
 public:
  CopyEvent(std::shared_future<void> done, uint64_t id, std::shared_ptr<Rules> rules)
      : done_(std::move(done)), id_(id), rules_(std::move(rules)) {}
  bool ready() const override {
    if (done_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    if (rules_) rules_->settle(id_);
    return true;
  }
  void host_wait() const override {
    done_.get();  // rethrows a failed copy
    if (rules_) rules_->settle(id_);
  }
  // The copy stream waiting for an earlier copy: orders no host or compute, settles nothing.
  void wait_on_copy_stream() const { done_.get(); }

 private:
  std::shared_future<void> done_;
  uint64_t id_;
  std::shared_ptr<Rules> rules_;
};

}  // namespace omni::offload::sim
