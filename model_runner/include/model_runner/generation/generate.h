// A model-agnostic autoregressive loop: the caller supplies each step's logits (running its
// model and KV cache however it likes), the loop samples, streams and decides when to stop.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model_runner/generation/sampler.h"

namespace omni::models {

struct GenerationResult {
  std::vector<int64_t> tokens;
  // "stop" (a stop token was generated; it is the last of `tokens`), "length" (max_new_tokens
  // reached) or "cancelled" (on_token returned false).
  std::string finish_reason;
};

// Logits [vocab] for step `step` (0-based), given the tokens generated so far.
using NextLogitsFn = std::function<at::Tensor(int64_t step, const std::vector<int64_t>& generated)>;
// Called with each token as soon as it is sampled; return false to stop generating.
using OnTokenFn = std::function<bool(int64_t token)>;

// Validates `params` first (throws omni::Error). A stop token ends the run as "stop" even if
// on_token also asks to cancel: the sequence is complete either way. The repetition penalty sees
// `prompt` followed by the tokens generated so far.
GenerationResult generate_tokens(const NextLogitsFn& next_logits, const SamplingParams& params,
                                 const OnTokenFn& on_token = nullptr,
                                 const std::vector<int64_t>& prompt = {});

}  // namespace omni::models
