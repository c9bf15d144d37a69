#include "model_runner/generation/generate.h"

#include <algorithm>

namespace omni::models {

GenerationResult generate_tokens(const NextLogitsFn& next_logits, const SamplingParams& params,
                                 const OnTokenFn& on_token, const std::vector<int64_t>& prompt) {
  Sampler sampler(params);  // validates
  GenerationResult result;
  result.tokens.reserve(static_cast<size_t>(params.max_new_tokens));
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
