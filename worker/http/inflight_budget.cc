#include "worker/http/inflight_budget.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace omni::http {

InflightBudget::InflightBudget(uint64_t limit) : limit_(limit) {}

bool InflightBudget::take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > limit_ - used_) {
    ++refused_;
    return false;
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return true;
}

void InflightBudget::give_back(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= std::min(used_, bytes);
}

uint64_t InflightBudget::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

uint64_t InflightBudget::peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

InflightBudget::Lease::Lease(Lease&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

InflightBudget::Lease& InflightBudget::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->give_back(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

InflightBudget::Lease::~Lease() {
  if (budget_ != nullptr) budget_->give_back(bytes_);
}

bool InflightBudget::Lease::grow(uint64_t bytes) {
  if (budget_ == nullptr || !budget_->take(bytes)) return false;
  bytes_ += bytes;
  return true;
}

namespace {

// A "Name:   123 kB" line of /proc/meminfo, in bytes; 0 when absent.
uint64_t meminfo_bytes(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    uint64_t kb = 0;
    fields >> kb;
    return kb << 10;
  }
  return 0;
}

// A cgroup v2 file holding a number of bytes ("max": none).
uint64_t cgroup_bytes(const std::string& file) {
  std::ifstream in("/sys/fs/cgroup/" + file);
  std::string value;
  if (!(in >> value) || value == "max") return std::numeric_limits<uint64_t>::max();
  try {
    return std::stoull(value);
  } catch (...) {
    return std::numeric_limits<uint64_t>::max();
  }
}

}  // namespace

uint64_t default_inflight_bytes(uint64_t floor) {
  uint64_t available = meminfo_bytes("MemAvailable");
  const uint64_t limit = cgroup_bytes("memory.max");
  const uint64_t current = cgroup_bytes("memory.current");
  if (limit != std::numeric_limits<uint64_t>::max() && current <= limit) {
    available = available == 0 ? limit - current : std::min(available, limit - current);
  }
  return std::max(available / 4, floor);
}

}  // namespace omni::http
