#include "model_runner/runner/code2wav_batcher.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "model_runner/runner/exclusive_forward.h"

namespace omni::models {
namespace {

// A window joins a forward while it is at most this many times the forward's shortest: the
// padding then costs at most (ratio - 1) of the work.
constexpr double kMaxLengthRatio = 1.5;

}  // namespace

Code2WavBatcher::Code2WavBatcher(qwen3_omni::Code2Wav& model, offload::OffloadBackend& backend,
                                 std::mutex& model_mutex, int64_t max_batch,
                                 std::chrono::microseconds straggler_wait)
    : model_(model),
      backend_(backend),
      model_mutex_(model_mutex),
      rendezvous_(max_batch, straggler_wait) {
  if (backend_.forwards_may_overlap()) background_ = std::make_unique<BackgroundWorker>();
}

void Code2WavBatcher::run(const std::function<void()>& fn) {
  run_exclusive(model_mutex_, backend_, fn);
}

at::Tensor Code2WavBatcher::decode(const at::Tensor& window) {
  Decode d;
  d.window = window;
  rendezvous_.call(d, [this](const auto& batch) { run_batch(batch); });
  return d.wav;
}

at::Tensor Code2WavBatcher::decode_first_audio(const at::Tensor& window,
                                               StepRendezvous::Member& member) {
  if (!backend_.forwards_may_overlap()) return decode(window);
  struct Away {
    StepRendezvous::Member& member;
    explicit Away(StepRendezvous::Member& m) : member(m) { member.waiting_for_input(true); }
    ~Away() { member.waiting_for_input(false); }
  } away(member);
  std::lock_guard<std::mutex> lane(first_audio_lane_);
  const auto compute = backend_.overlapping_scope();
  auto wav = model_.forward_validated(window);
  ++forwards_;
  ++first_audio_forwards_;
  return wav;
}

void Code2WavBatcher::run_batch(const std::vector<StepRendezvous::Ticket*>& batch) {
  std::vector<Decode*> all;
  for (auto* t : batch) all.push_back(static_cast<Decode*>(t));
  std::stable_sort(all.begin(), all.end(), [](const Decode* a, const Decode* b) {
    return a->window.size(1) < b->window.size(1);
  });
  // One forward: the shortest windows and those close to them. The longer ones go in the next
  // batch, so that a short window (a first chunk: first audio) returns without waiting for them.
  size_t end = 1;
  const auto shortest = static_cast<double>(all[0]->window.size(1));
  while (end < all.size() &&
         static_cast<double>(all[end]->window.size(1)) <= kMaxLengthRatio * shortest) {
    ++end;
  }
  for (size_t i = end; i < all.size(); ++i) all[i]->deferred = true;
  decode_group({all.begin(), all.begin() + static_cast<std::ptrdiff_t>(end)});
}

void Code2WavBatcher::decode_group(const std::vector<Decode*>& group) {
  const auto forward = [&](const std::function<void()>& fn) {
    if (background_) {
      background_->run([&] { run(fn); });
    } else {
      run(fn);
    }
  };
  if (group.size() == 1) {
    forward([&] { group[0]->wav = model_.forward_validated(group[0]->window); });
  } else {
    const int64_t frames = group.back()->window.size(1);  // the longest: sorted
    std::vector<at::Tensor> rows;
    for (const auto* d : group) {
      rows.push_back(at::constant_pad_nd(d->window.to(at::kLong), {0, frames - d->window.size(1)}));
    }
    const auto codes = at::stack(rows);
    at::Tensor wav;
    forward([&] { wav = model_.forward_validated(codes); });
    // Every forward ends the same number of samples short of frames * samples_per_frame.
    const int64_t short_by = frames * model_.samples_per_frame() - wav.size(-1);
    for (size_t i = 0; i < group.size(); ++i) {
      const int64_t keep = group[i]->window.size(1) * model_.samples_per_frame() - short_by;
      group[i]->wav = wav.narrow(0, static_cast<int64_t>(i), 1).narrow(-1, 0, keep).clone();
    }
  }
  ++forwards_;
}

}  // namespace omni::models
