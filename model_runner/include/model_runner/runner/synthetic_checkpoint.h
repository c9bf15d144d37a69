// Writes a Qwen3-Omni-MoE checkpoint directory with random weights (config.json,
// model.safetensors, tokenizer.json, preprocessor_config.json) in the real on-disk layout, so
// benchmarks can run thinkers of chosen sizes without downloads. The tokenizer and the
// preprocessor config are copied from `assets_dir` (the tiny fixture: its vocabulary and
// special-token ids fit every preset).
#pragma once

#include <cstdint>
#include <string>

#include "model_runner/qwen3_omni/code2wav.h"
#include "model_runner/qwen3_omni/config.h"

namespace omni::models {

// "tiny" (the test fixture's shapes, ~2 MB), "small" (~0.25 GB fp32: 8 MoE layers of 16
// experts), "medium" (~1 GB fp32: 12 layers of 32 experts, larger encoders), "speech-real"
// (hidden 2048 like the real thinker, which the real talker's projections read, but only 2
// small MoE layers and small encoders: a cheap thinker in front of a real-size talker) or
// "real" (Qwen3-Omni-30B-A3B's text model: hidden 2048, 32/4 heads of 128, 48 layers of 128
// experts top-8, moe_intermediate 768, vocab 152064; small encoders; ~1.25 GB per layer in
// bf16, set num_hidden_layers for fewer).
qwen3_omni::ThinkerConfig synthetic_thinker_config(const std::string& preset);

// The speech half of a synthetic checkpoint (talker_config, code2wav_config, token ids).
struct SyntheticSpeech {
  qwen3_omni::TalkerConfig talker;
  qwen3_omni::Code2WavConfig code2wav;
  qwen3_omni::OmniTokenIds ids;
};
// "tiny": the test fixture's talker and code2wav shapes. "real": Qwen3-Omni-30B-A3B-Instruct's
// (talker: 20 MoE layers of 128 experts top-6 with a shared expert, hidden 1024, 16 heads;
// code predictor: 5 layers, hidden 1024; code2wav: 8 layers, hidden 1024, decoder 1536; codec
// ids and speakers of the released config.json); `talker_layers` > 0 overrides the layer count.
// The thinker's hidden size must be what the talker reads (2048 for "real").
SyntheticSpeech synthetic_speech_config(const std::string& preset,
                                        const qwen3_omni::ThinkerConfig& thinker,
                                        int64_t talker_layers = 0);

// Writes the checkpoint into `dir` (created; existing files replaced). Weights ~ N(0, 0.02)
// (norm weights 1) from `seed`, stored as `dtype`; with `speech`, the talker and code2wav too
// (enable_audio_output true). Returns the parameter bytes written. A directory that already
// holds this exact checkpoint (config, dtype and seed, recorded in synthetic.json once the
// files are complete) is reused as it is.
int64_t write_synthetic_checkpoint(const std::string& dir, const qwen3_omni::ThinkerConfig& cfg,
                                   const std::string& assets_dir, at::ScalarType dtype = at::kFloat,
                                   uint64_t seed = 0, const SyntheticSpeech* speech = nullptr);

}  // namespace omni::models
