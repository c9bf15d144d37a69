#include "model_runner/runner/talker_batcher.h"

#include <ATen/ATen.h>

#include "model_runner/runner/exclusive_forward.h"

namespace omni::models {
namespace {

// How long a step waits for a request that is neither stepping nor waiting for input (between
// two steps: sending its frame, or running its prefill) before it goes without it.
constexpr auto kStragglerWait = std::chrono::milliseconds(2);

}  // namespace

TalkerBatcher::TalkerBatcher(qwen3_omni::Talker& talker, offload::OffloadBackend& backend,
                             std::mutex& model_mutex, int64_t max_batch)
    : talker_(talker),
      backend_(backend),
      model_mutex_(model_mutex),
      rendezvous_(max_batch, kStragglerWait) {}

void TalkerBatcher::run(const std::function<void()>& fn) {
  run_exclusive(model_mutex_, backend_, fn);
}

std::vector<int64_t> TalkerBatcher::step(int64_t code0, qwen3_omni::TalkerState& state,
                                         Sampler& sampler, at::Tensor& next_logits) {
  Step s;
  s.code0 = code0;
  s.state = &state;
  s.sampler = &sampler;
  rendezvous_.call(s, [this](const auto& batch) { run_batch(batch); });
  next_logits = s.logits;
  return std::move(s.frame);
}

void TalkerBatcher::run_batch(const std::vector<StepRendezvous::Ticket*>& batch) {
  std::vector<int64_t> codes;
  std::vector<qwen3_omni::TalkerState*> states;
  std::vector<Sampler*> samplers;
  for (auto* t : batch) {
    const auto* s = static_cast<Step*>(t);
    codes.push_back(s->code0);
    states.push_back(s->state);
    samplers.push_back(s->sampler);
  }
  at::Tensor logits;
  std::vector<std::vector<int64_t>> frames;
  run([&] { frames = talker_.step_batch(codes, states, samplers, logits); });
  for (size_t i = 0; i < batch.size(); ++i) {
    auto* s = static_cast<Step*>(batch[i]);
    s->frame = std::move(frames[i]);
    s->logits = logits[static_cast<int64_t>(i)];
  }
}

}  // namespace omni::models
