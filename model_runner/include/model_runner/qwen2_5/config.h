// The Qwen2.5 text decoder's settings (Qwen2.5-VL's language model: Qwen-Image's text encoder,
// the Qwen2.5-Omni thinker's decoder), as a plain struct parsed once at load with errors that
// name config.json and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {
class HfConfig;
}

namespace omni::models::qwen2_5 {

struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  // Multimodal rope: the head's frequencies split into consecutive sections taking their angle
  // from the temporal, height and width position in turn (sums to head_dim / 2). Empty: plain
  // rope over one position per token (a Qwen2 config).
  std::vector<int64_t> mrope_section;
  bool tie_word_embeddings = false;

  // Reads the `text_config` of a Qwen2-VL / Qwen2.5-VL config.json (or its top level where
  // there is none, as in the first Qwen2.5-VL releases), or a flat Qwen2 config.json. Rope
  // settings come from "rope_parameters" (transformers 5) or "rope_theta" + "rope_scaling"
  // (4.x). Refused, naming the file and the field: another activation than silu, sliding-window
  // or non-default rope, a head_dim other than hidden_size / num_attention_heads, and shapes
  // that do not divide.
  static TextConfig parse(const HfConfig& json);
  // parse() of `<dir>/config.json` (or of the file `dir`).
  static TextConfig load(const std::string& dir);
};

}  // namespace omni::models::qwen2_5
