// Qwen2.5-VL's vision tower settings and the special tokens that place images in a prompt, as
// plain structs parsed once at load with errors that name config.json and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {
class HfConfig;
}

namespace omni::models::qwen2_5 {

struct VisionConfig {
  int64_t depth = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_heads
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  // Side of an attention window in pixels: window_size / spatial_merge_size / patch_size merged
  // patches.
  int64_t window_size = 112;
  int64_t out_hidden_size = 0;  // the text decoder's hidden size
  // The blocks that attend over the whole frame; the others attend inside windows.
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  double rope_theta = 10000.0;
  // attn.q, attn.k, attn.v instead of one attn.qkv: Qwen2.5-Omni's vision encoder (model_type
  // "qwen2_5_omni_vision_encoder"; load_vision_tower also sets it where the checkpoint has them).
  bool split_qkv = false;

  // Reads the `vision_config` of a Qwen2.5-VL config.json (or `json` itself where it has none:
  // a vision config on its own). The shapes (depth, hidden_size, intermediate_size, num_heads,
  // out_hidden_size) must be present; the rest default as in transformers, which also ignores
  // the released checkpoints' "in_chans" and "spatial_patch_size". Refused, naming the file and
  // the field: another activation than silu, a head_dim that is not a multiple of 4 (the axial
  // rope's four quarters), a window smaller than one merged patch, a negative block index, a rope
  // type other than "axial". Indexes past the last block name no block, as in transformers.
  static VisionConfig parse(const HfConfig& json);
  // parse() of `<dir>/config.json` (or of the file `dir`).
  static VisionConfig load(const std::string& dir);
};

// The top-level token ids of a Qwen2.5-VL config.json (transformers' defaults where absent, the
// released ones). An image enters a prompt as <|vision_start|>, <|image_pad|> once per merged
// patch, <|vision_end|>.
struct ImageTokenIds {
  int64_t image_token_id = 151655;         // <|image_pad|>
  int64_t video_token_id = 151656;         // <|video_pad|>
  int64_t vision_start_token_id = 151652;  // <|vision_start|>
  int64_t vision_end_token_id = 151653;    // <|vision_end|>

  static ImageTokenIds parse(const HfConfig& json);
  static ImageTokenIds load(const std::string& dir);
};

}  // namespace omni::models::qwen2_5
