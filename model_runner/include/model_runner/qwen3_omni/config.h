// The parts of a Qwen3-Omni-MoE config.json the thinker reads, as plain structs. Parsed once at
// load (parse_thinker_config), validated there with errors that name config.json and the field;
// model code never sees JSON.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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
  // The context in positions: prompt plus generated tokens may not exceed it (0: no limit).
  int64_t max_position_embeddings = 0;
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
  // The talker's MoE adds a shared expert gated by sigmoid(shared_expert_gate(x)); 0 = none.
  int64_t shared_expert_intermediate_size = 0;

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

// The talker's code predictor: a small dense Qwen3 decoder (q/k norm, 1-D rope) with one codec
// embedding table and one head per residual code group.
struct CodePredictorConfig {
  int64_t vocab_size = 2048;  // codes per group
  int64_t hidden_size = 1024;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 5;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  bool attention_bias = false;
  int64_t num_code_groups = 16;
};

// Ids the multimodal rope index reads (the thinker's and the talker's configs each have theirs).
struct RopeIndexIds {
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t spatial_merge_size = 2;
  int64_t position_id_per_seconds = 25;
};

// talker_config of config.json.
struct TalkerConfig {
  TextConfig text;  // every layer is sparse with a shared expert, whatever mlp_only_layers says
  CodePredictorConfig code_predictor;
  int64_t num_code_groups = 16;
  int64_t thinker_hidden_size = 2048;
  int64_t accept_hidden_layer = 24;  // thinker hidden_states index the talker reads
  int64_t codec_eos_token_id = 2150;
  int64_t codec_nothink_id = 2155;
  int64_t codec_think_bos_id = 2156;
  int64_t codec_think_eos_id = 2157;
  int64_t codec_pad_id = 2148;
  int64_t codec_bos_id = 2149;
  std::vector<std::pair<std::string, int64_t>> speakers;  // lower-case name -> codec id, sorted
  RopeIndexIds rope;
};

// The whole Qwen3OmniMoeForConditionalGeneration config: the thinker and, when
// enable_audio_output, the talker and code2wav (code2wav's own struct lives with its model), plus
// the chat-template token ids the thinker -> talker hand-off reads.
struct OmniTokenIds {
  int64_t im_start = 151644;
  int64_t im_end = 151645;
  int64_t tts_pad = 151671;
  int64_t tts_bos = 151672;
  int64_t tts_eos = 151673;
  int64_t system = 8948;
  int64_t user = 872;
  int64_t assistant = 77091;
};

// The architectures this runner implements, as named in config.json "architectures".
const std::vector<std::string>& supported_architectures();

// Reads a Qwen3OmniMoeForConditionalGeneration or Qwen3OmniMoeThinkerForConditionalGeneration
// config.json. Throws omni::Error naming the file and field on a missing or inconsistent value,
// and on an unknown architecture (listing the supported ones).
ThinkerConfig parse_thinker_config(const HfConfig& config);

// The thinker's ids for the rope index.
RopeIndexIds rope_index_ids(const ThinkerConfig& cfg);

// True when config.json describes a model with speech output (a full
// Qwen3OmniMoeForConditionalGeneration with enable_audio_output, the default).
bool has_speech_output(const HfConfig& config);
// talker_config (throws naming config.json and the field); `thinker` is checked against it.
TalkerConfig parse_talker_config(const HfConfig& config, const ThinkerConfig& thinker);
// The top-level token ids.
OmniTokenIds parse_omni_token_ids(const HfConfig& config, const ThinkerConfig& thinker);

}  // namespace omni::models::qwen3_omni
