#include "cpu_offload/load_progress.h"

#include <cstdio>
#include <unordered_set>

#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

thread_local LoadProgress* current = nullptr;

std::string gigabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

}  // namespace

LoadProgress::LoadProgress(std::string what, uint64_t total_bytes, double interval_s)
    : what_(std::move(what)),
      total_(total_bytes),
      interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(interval_s))),
      start_(std::chrono::steady_clock::now()),
      next_(start_ + interval_),
      outer_(current) {
  current = this;
}

LoadProgress::~LoadProgress() {
  current = outer_;
  if (outer_ != nullptr) outer_->done_ += done_;  // part of the outer job (no line of its own)
  if (lines_ > 0) report(/*last=*/true);
}

void LoadProgress::add(uint64_t bytes) {
  LoadProgress* p = current;
  if (p == nullptr) return;
  p->done_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  if (now < p->next_) return;
  p->next_ = now + p->interval_;
  p->report(/*last=*/false);
}

void LoadProgress::report(bool last) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char time[32];
  std::snprintf(time, sizeof(time), "%.1f s", seconds);
  if (last) {
    log_info(what_, ": ", gigabytes(done_), " placed in ", time);
  } else {
    const double percent =
        total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 0.0;
    char share[16];
    std::snprintf(share, sizeof(share), "%.0f%%", percent);
    log_info(what_, ": ", gigabytes(done_), " of ", gigabytes(total_), " (", share, ") after ",
             time);
  }
  ++lines_;
}

uint64_t module_tensor_bytes(torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  uint64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    // By start address, not storage: the tensors that view a checkpoint's mapping may share
    // one storage, while tied weights are the same tensor.
    if (!t.defined() || t.numel() == 0 || !seen.insert(t.data_ptr()).second) return;
    bytes += t.nbytes();
  };
  for (const auto& p : module.named_parameters(true)) count(p.value());
  for (const auto& b : module.named_buffers(true)) count(b.value());
  return bytes;
}

}  // namespace omni::offload
