// One budget for the bytes requests hold while the server reads, parses and answers them:
// bodies being read, parsed JSON, decoded media, video frames and answers held for clients. A
// request takes its bytes from the budget before it allocates them; one that does not fit now
// is refused with 503 and Retry-After (or waits, for a queued video job) instead of taking the
// server's memory, and one that could never fit is refused as too large.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace omni::http {

class InflightBudget {
 public:
  explicit InflightBudget(uint64_t limit);

  // Bytes one request holds; given back when the lease is destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    // Takes `bytes` more; false (and nothing taken) when the budget has no room for them now.
    bool grow(uint64_t bytes);
    uint64_t bytes() const { return bytes_; }

   private:
    friend class InflightBudget;
    InflightBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // An empty lease of this budget.
  Lease lease() {
    Lease l;
    l.budget_ = this;
    return l;
  }

  uint64_t limit() const { return limit_; }
  uint64_t used() const;
  uint64_t peak() const;
  // Requests refused because their bytes did not fit.
  uint64_t refused() const { return refused_.load(); }

 private:
  bool take(uint64_t bytes);
  void give_back(uint64_t bytes);

  const uint64_t limit_;
  mutable std::mutex mutex_;
  uint64_t used_ = 0, peak_ = 0;
  std::atomic<uint64_t> refused_{0};
};

// The default budget: a quarter of the memory this process can still take (MemAvailable, or
// the cgroup's memory.max minus its usage when that is lower), read when called (after the
// model has loaded), at least `floor` bytes.
uint64_t default_inflight_bytes(uint64_t floor);

}  // namespace omni::http
