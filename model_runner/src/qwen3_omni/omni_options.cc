#include "model_runner/qwen3_omni/omni_options.h"

namespace omni::models {

// The reference's generation defaults (Qwen3-Omni's generation_config and modeling code).
SamplingParams OmniSampling::default_thinker() {
  SamplingParams p;
  p.temperature = 0.4;
  p.top_p = 0.9;
  p.top_k = 1;
  p.repetition_penalty = 1.05;
  p.max_new_tokens = 2048;
  return p;
}

SamplingParams OmniSampling::default_talker() {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 50;
  p.top_p = 1.0;
  p.repetition_penalty = 1.05;
  p.max_new_tokens = 4097;  // 4096 frames: the last sampled code is never fed back
  return p;
}

SamplingParams OmniSampling::default_code_predictor() {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 50;
  p.top_p = 0.8;
  return p;
}

void OmniSampling::set_greedy(bool greedy) {
  thinker.greedy = greedy;
  talker.greedy = greedy;
  code_predictor.greedy = greedy;
}

void OmniSampling::set_seed(uint64_t seed) {
  thinker.seed = seed;
  talker.seed = seed;
  code_predictor.seed = seed;
}

}  // namespace omni::models
