// Picks the next token from a step's logits with Hugging Face `generate` semantics: the logits
// processors (repetition penalty, then suppressed tokens), then the temperature, top-k and top-p
// warpers in HF's order and a multinomial draw, or argmax after the processors when greedy.
// Everything runs in float32 on the CPU so that a seed gives the same tokens on every machine,
// whatever the logits' dtype or device.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace omni::models {

struct SamplingParams {
  // Divides the logits; 0 means greedy (HF would reject it, but 0 is the common API spelling).
  double temperature = 1.0;
  // Keep the k largest logits (ties at the k-th value kept, as HF); 0 = off.
  int64_t top_k = 0;
  // Keep the smallest set of top tokens whose probability reaches top_p; 1 = off.
  double top_p = 1.0;
  // Seeds the Sampler's own CPU generator: a run is reproducible from it.
  uint64_t seed = 0;
  // Argmax (first index on ties) after the processors; no randomness.
  bool greedy = false;
  // HF RepetitionPenaltyLogitsProcessor over the context given to sample(): a logit of a token
  // seen there is divided by the penalty when positive, multiplied when negative. 1 = off.
  double repetition_penalty = 1.0;
  // Ids that can never be drawn (HF SuppressTokensLogitsProcessor: their logits become -inf).
  std::vector<int64_t> suppress_tokens;
  int64_t max_new_tokens = 16;
  // The model's context: the prompt plus max_new_tokens may not exceed it (0: no limit).
  int64_t max_context = 0;
  // Generation ends after any of these (the stop token is part of the output, as in HF).
  std::vector<int64_t> stop_token_ids;

  // Throws omni::Error naming the field and its value.
  void validate() const;
  // greedy, or temperature 0.
  bool is_greedy() const { return greedy || temperature == 0.0; }
};

class Sampler {
 public:
  // Validates `params`.
  explicit Sampler(SamplingParams params);

  // `logits`: [vocab] (or [1, vocab]), any floating dtype, any device. `context`: the token ids
  // the repetition penalty looks at (HF's input_ids: the prompt and what was generated for a
  // text model, only the generated codes for the talker). Advances the generator by one draw
  // unless greedy.
  int64_t sample(const at::Tensor& logits, const std::vector<int64_t>& context = {});
  // One draw per row of `logits` [B, vocab] (B = samplers.size()): the ids
  // samplers[i]->sample(logits[i], *contexts[i]) gives, each from its own generator. `contexts`:
  // empty (no repetition-penalty context) or one per row (null: none). When the samplers share
  // their parameters the warpers run once over the whole batch.
  // `noise`: what draw_noise drew ahead for this draw ([B, vocab]); undefined: drawn now.
  static std::vector<int64_t> sample_rows(
      const std::vector<Sampler*>& samplers, const at::Tensor& logits,
      const std::vector<const std::vector<int64_t>*>& contexts = {}, const at::Tensor& noise = {});
  // The random numbers of each sampler's next `draws` draws over `vocab` ids, taken from its
  // generator now: [B, draws, vocab], the uniform doubles exponential_ would turn into Exp(1)
  // noise (the draw turns only those of tokens it can pick). sample_rows(..., noise.select(1, k))
  // at the k-th of those draws gives exactly the ids drawing then gives (the CPU generator's
  // stream is serial). Greedy rows draw nothing.
  static at::Tensor draw_noise(const std::vector<Sampler*>& samplers, int64_t draws, int64_t vocab);

  const SamplingParams& params() const { return params_; }

 private:
  // sample() with the noise drawn ahead for it ([vocab]; undefined: drawn now).
  int64_t sample_with(const at::Tensor& logits, const std::vector<int64_t>& context,
                      const at::Tensor& noise);

  SamplingParams params_;
  at::Generator gen_;
};

}  // namespace omni::models
