#include "model_runner/generation/generate.h"

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models {

GenerationResult generate_tokens(const NextLogitsFn& next_logits, const SamplingParams& params,
                                 const OnTokenFn& on_token, const std::vector<int64_t>& prompt) {
  Sampler sampler(params);  // validates
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  if (params.max_context > 0) {
    OMNI_CHECK(prompt_tokens < params.max_context, "the prompt (", prompt_tokens,
               " tokens) does not fit the model's context of ", params.max_context, " tokens");
    // (Written so that a huge max_new_tokens cannot overflow.)
    OMNI_CHECK(params.max_new_tokens <= params.max_context - prompt_tokens, "the prompt (",
               prompt_tokens, " tokens) plus max_new_tokens (", params.max_new_tokens,
               ") exceed the model's context of ", params.max_context, " tokens: ask for at most ",
               params.max_context - prompt_tokens, " new tokens");
  }
  GenerationResult result;
  // Grows as tokens come: max_new_tokens is a cap, not a size to allocate up front.
  result.tokens.reserve(static_cast<size_t>(std::min<int64_t>(params.max_new_tokens, 1024)));
  const auto& stops = params.stop_token_ids;
  // What the repetition penalty sees: only kept when it is on.
  const bool penalize = params.repetition_penalty != 1.0;
  std::vector<int64_t> context = penalize ? prompt : std::vector<int64_t>{};
  for (int64_t step = 0; step < params.max_new_tokens; ++step) {
    const int64_t token = sampler.sample(next_logits(step, result.tokens), context);
    result.tokens.push_back(token);
    if (penalize) context.push_back(token);
    const bool keep_going = !on_token || on_token(token);
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      result.finish_reason = "stop";
      return result;
    }
    if (!keep_going) {
      result.finish_reason = "cancelled";
      return result;
    }
  }
  result.finish_reason = "length";
  return result;
}

}  // namespace omni::models
