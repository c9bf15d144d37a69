#include "model_runner/runner/talker_batcher.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace omni::models {
namespace {

using Clock = std::chrono::steady_clock;
// How long a step waits for a request that is neither stepping nor waiting for input (between
// two steps: sending its frame, or running its prefill) before it goes without it.
constexpr auto kStragglerWait = std::chrono::milliseconds(2);

}  // namespace

TalkerBatcher::TalkerBatcher(qwen3_omni::Talker& talker, offload::OffloadBackend& backend,
                             std::mutex& model_mutex, int64_t max_batch)
    : talker_(talker),
      backend_(backend),
      model_mutex_(model_mutex),
      max_batch_(std::max<int64_t>(1, max_batch)) {}

TalkerBatcher::Member::Member(TalkerBatcher& b) : batcher_(b) {
  std::lock_guard<std::mutex> lock(b.mutex_);
  ++b.members_;
}

TalkerBatcher::Member::~Member() {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  --batcher_.members_;
  if (waiting_) --batcher_.waiting_input_;
  batcher_.changed_.notify_all();
}

void TalkerBatcher::Member::waiting_for_input(bool waiting) {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  if (waiting == waiting_) return;
  waiting_ = waiting;
  batcher_.waiting_input_ += waiting ? 1 : -1;
  batcher_.changed_.notify_all();
}

void TalkerBatcher::run(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(model_mutex_);
  auto forward = backend_.forward_scope();
  fn();
}

bool TalkerBatcher::batch_ready(Clock::time_point now) const {
  if (pending_.empty() || running_batch_) return false;
  const auto can_step = members_ - waiting_input_;
  return static_cast<int64_t>(pending_.size()) >= std::min(can_step, max_batch_) ||
         now - first_pending_ >= kStragglerWait;
}

std::vector<int64_t> TalkerBatcher::step(int64_t code0, qwen3_omni::TalkerState& state,
                                         Sampler& sampler, at::Tensor& next_logits) {
  Pending p{code0, &state, &sampler, {}, {}, nullptr, false};
  std::unique_lock<std::mutex> lock(mutex_);
  if (pending_.empty()) first_pending_ = Clock::now();
  pending_.push_back(&p);
  changed_.notify_all();
  while (!p.done) {
    if (batch_ready(Clock::now())) {
      // This thread runs the batch (the oldest requests first, up to max_batch).
      const size_t n = std::min(pending_.size(), static_cast<size_t>(max_batch_));
      std::vector<Pending*> batch(pending_.begin(), pending_.begin() + static_cast<long>(n));
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(n));
      if (!pending_.empty()) first_pending_ = Clock::now();
      running_batch_ = true;
      lock.unlock();
      run_batch(batch);
      lock.lock();
      running_batch_ = false;
      ++steps_;
      rows_ += static_cast<int64_t>(batch.size());
      largest_batch_ = std::max(largest_batch_, static_cast<int64_t>(batch.size()));
      for (auto* q : batch) q->done = true;
      changed_.notify_all();
    } else {
      changed_.wait_for(lock, kStragglerWait);
    }
  }
  if (p.error) std::rethrow_exception(p.error);
  next_logits = p.logits;
  return std::move(p.frame);
}

void TalkerBatcher::run_batch(const std::vector<Pending*>& batch) {
  std::vector<int64_t> codes;
  std::vector<qwen3_omni::TalkerState*> states;
  std::vector<Sampler*> samplers;
  for (const auto* p : batch) {
    codes.push_back(p->code0);
    states.push_back(p->state);
    samplers.push_back(p->sampler);
  }
  try {
    at::Tensor logits;
    std::vector<std::vector<int64_t>> frames;
    run([&] { frames = talker_.step_batch(codes, states, samplers, logits); });
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->frame = std::move(frames[i]);
      batch[i]->logits = logits[static_cast<int64_t>(i)];
    }
  } catch (...) {
    for (auto* p : batch) p->error = std::current_exception();
  }
}

int64_t TalkerBatcher::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_;
}

int64_t TalkerBatcher::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rows_;
}

int64_t TalkerBatcher::largest_batch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return largest_batch_;
}

}  // namespace omni::models
