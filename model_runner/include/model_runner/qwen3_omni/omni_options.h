// Qwen3-Omni's parameters of a request: its stages' sampling (the reference's defaults), the
// talker's frame cap and code2wav's streamed chunks.
#pragma once

#include <cstdint>

#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"

namespace omni::models {

// Sampling of each stage; the defaults are the reference's (Qwen3-Omni generation defaults).
struct OmniSampling {
  // temperature 0.4, top_p 0.9, top_k 1, repetition penalty 1.05 (prompt and answer), 2048 tokens.
  SamplingParams thinker = default_thinker();
  // temperature 0.9, top_k 50, repetition penalty 1.05 (generated codes), max_new_tokens =
  // frames + 1 (4096 frames); only codes 0..codebook-1 and codec EOS may be drawn.
  SamplingParams talker = default_talker();
  // top_k 50, top_p 0.8 when sampling (the talker's greedy flag applies to it, as in the
  // reference since transformers 5.15).
  SamplingParams code_predictor = default_code_predictor();

  static SamplingParams default_thinker();
  static SamplingParams default_talker();
  static SamplingParams default_code_predictor();
  // Argmax after the logits processors (repetition penalty, suppressed ids) in every stage.
  void set_greedy(bool greedy);
  // One seed for all stages (each stage draws from its own generator seeded with it).
  void set_seed(uint64_t seed);
};

// Qwen3-Omni's own parameters of a request (pipeline::Request::parts): the sampling of each
// stage, the talker's frame cap, code2wav's streamed chunks.
struct OmniOptions {
  int64_t max_audio_frames = 4096;  // talker frames cap (80 ms each)
  OmniSampling sampling;
  // Frames per chunk: a small first chunk so that audio starts early (4, then 25, with 25 frames
  // of left context by default).
  qwen3_omni::Code2WavStreamOptions stream;
};

}  // namespace omni::models
