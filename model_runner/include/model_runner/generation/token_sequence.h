// One request's autoregressive decisions, whatever model and batch produce its logits: its own
// Sampler (and generator, so that its draws do not depend on who shares its batch), the context
// the repetition penalty sees, the tokens so far, and when to stop (a stop token, max_new_tokens,
// or the caller cancelling). generate_tokens drives one; a serving engine drives one per row.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model_runner/generation/sampler.h"

namespace omni::models {

class TokenSequence {
 public:
  // Validates `params` and that `prompt` plus max_new_tokens fit params.max_context (throws
  // omni::Error). The repetition penalty sees `prompt` followed by the generated tokens.
  TokenSequence(SamplingParams params, const std::vector<int64_t>& prompt);

  // Samples the next token from `logits` ([vocab] or [1, vocab]) and records it; finished()
  // may then be true. Must not be called once finished.
  int64_t sample(const at::Tensor& logits);
  // Ends the sequence as "cancelled" unless it already finished.
  void cancel();

  bool finished() const { return !finish_reason_.empty(); }
  // "stop" (a stop token; the last of tokens()), "length" or "cancelled"; empty while running.
  const std::string& finish_reason() const { return finish_reason_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const SamplingParams& params() const { return sampler_.params(); }

 private:
  Sampler sampler_;
  std::vector<int64_t> context_;  // kept only with a repetition penalty
  std::vector<int64_t> tokens_;
  std::string finish_reason_;
};

}  // namespace omni::models
