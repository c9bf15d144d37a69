#include "model_runner/generation/token_sequence.h"

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models {

TokenSequence::TokenSequence(SamplingParams params, const std::vector<int64_t>& prompt)
    : sampler_(std::move(params)) {  // validates
  const auto& p = sampler_.params();
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  if (p.max_context > 0) {
    OMNI_CHECK(prompt_tokens < p.max_context, "the prompt (", prompt_tokens,
               " tokens) does not fit the model's context of ", p.max_context, " tokens");
    // (Written so that a huge max_new_tokens cannot overflow.)
    OMNI_CHECK(p.max_new_tokens <= p.max_context - prompt_tokens, "the prompt (", prompt_tokens,
               " tokens) plus max_new_tokens (", p.max_new_tokens,
               ") exceed the model's context of ", p.max_context, " tokens: ask for at most ",
               p.max_context - prompt_tokens, " new tokens");
  }
  if (p.repetition_penalty != 1.0) context_ = prompt;
  // Grows as tokens come: max_new_tokens is a cap, not a size to allocate up front.
  tokens_.reserve(static_cast<size_t>(std::min<int64_t>(p.max_new_tokens, 1024)));
  if (p.max_new_tokens == 0) finish_reason_ = "length";
}

int64_t TokenSequence::sample(const at::Tensor& logits) {
  OMNI_CHECK(!finished(), "TokenSequence::sample: the sequence already finished (", finish_reason_,
             ")");
  const auto& p = sampler_.params();
  const int64_t token = sampler_.sample(logits, context_);
  tokens_.push_back(token);
  if (p.repetition_penalty != 1.0) context_.push_back(token);
  const auto& stops = p.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
    finish_reason_ = "stop";
  } else if (static_cast<int64_t>(tokens_.size()) >= p.max_new_tokens) {
    finish_reason_ = "length";
  }
  return token;
}

void TokenSequence::cancel() {
  if (!finished()) finish_reason_ = "cancelled";
}

}  // namespace omni::models
