#include "model_runner/generation/generate.h"

#include "model_runner/generation/token_sequence.h"

namespace omni::models {

GenerationResult generate_tokens(const NextLogitsFn& next_logits, const SamplingParams& params,
                                 const OnTokenFn& on_token, const std::vector<int64_t>& prompt) {
  TokenSequence sequence(params, prompt);  // validates
  for (int64_t step = 0; !sequence.finished(); ++step) {
    const int64_t token = sequence.sample(next_logits(step, sequence.tokens()));
    // A stop token ends the run as "stop" even when on_token asks to cancel.
    if (on_token && !on_token(token)) sequence.cancel();
  }
  return {sequence.tokens(), sequence.finish_reason()};
}

}  // namespace omni::models
