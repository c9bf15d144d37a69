// The parts of a Qwen3-Omni-MoE config.json the thinker reads, as plain structs. Parsed once at
// load (parse_thinker_config), validated there with errors that name config.json and the field;
// model code never sees JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {
class HfConfig;
}

namespace omni::models::qwen3_omni {

struct AudioEncoderConfig {
  int64_t num_mel_bins = 128;
  int64_t d_model = 1280;
  int64_t encoder_layers = 32;
  int64_t encoder_attention_heads = 20;
  int64_t encoder_ffn_dim = 5120;
  int64_t max_source_positions = 1500;
  int64_t n_window = 50;         // chunks of 2 * n_window mel frames
  int64_t n_window_infer = 800;  // attention windows of this many mel frames
  int64_t conv_chunksize = 500;  // chunks per convolution call (memory only)
  int64_t downsample_hidden_size = 480;
  int64_t output_dim = 3584;  // == text hidden size
  std::string activation_function = "gelu";
  bool scale_embedding = false;
};

struct VisionEncoderConfig {
  int64_t depth = 27;
  int64_t hidden_size = 1152;
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 3584;          // == text hidden size
  int64_t num_position_embeddings = 2304;  // a perfect square
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  std::string hidden_act = "gelu_pytorch_tanh";
  double rope_theta = 10000.0;
};

struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP layers
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;
  double rope_theta = 1000000.0;
  std::vector<int64_t> mrope_section = {24, 20, 20};  // sums to head_dim / 2
  bool mrope_interleaved = true;
  // MoE: layer i is sparse when num_experts > 0, i is not in mlp_only_layers and
  // (i + 1) % decoder_sparse_step == 0.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  std::vector<int64_t> mlp_only_layers;

  bool is_sparse_layer(int64_t layer) const;
};

struct ThinkerConfig {
  TextConfig text;
  AudioEncoderConfig audio;
  VisionEncoderConfig vision;
  int64_t audio_token_id = 151646;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t audio_start_token_id = 151647;
  int64_t audio_end_token_id = 151648;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  int64_t position_id_per_seconds = 25;
  bool tie_word_embeddings = false;
  // Tensor-name prefix of the thinker in the checkpoint: "thinker." for the full
  // Qwen3OmniMoeForConditionalGeneration, "" for a thinker saved on its own.
  std::string weight_prefix = "thinker.";
};

// The architectures this runner implements, as named in config.json "architectures".
const std::vector<std::string>& supported_architectures();

// Reads a Qwen3OmniMoeForConditionalGeneration or Qwen3OmniMoeThinkerForConditionalGeneration
// config.json. Throws omni::Error naming the file and field on a missing or inconsistent value,
// and on an unknown architecture (listing the supported ones).
ThinkerConfig parse_thinker_config(const HfConfig& config);

}  // namespace omni::models::qwen3_omni
