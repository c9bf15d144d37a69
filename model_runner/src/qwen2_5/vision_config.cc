#include "model_runner/qwen2_5/vision_config.h"

#include <string>

#include "model_runner/weights/hf_config.h"
#include "weights/config_checks.h"

namespace omni::models::qwen2_5 {

VisionConfig VisionConfig::parse(const HfConfig& json) {
  const HfConfig c = json.has("vision_config") ? json.sub("vision_config") : json;
  VisionConfig v;
  v.depth = positive(c, "depth");
  v.hidden_size = positive(c, "hidden_size");
  v.intermediate_size = positive(c, "intermediate_size");
  v.num_heads = positive(c, "num_heads");
  v.out_hidden_size = positive(c, "out_hidden_size");
  v.in_channels = positive(c, "in_channels", v.in_channels);
  v.patch_size = positive(c, "patch_size", v.patch_size);
  v.temporal_patch_size = positive(c, "temporal_patch_size", v.temporal_patch_size);
  v.spatial_merge_size = positive(c, "spatial_merge_size", v.spatial_merge_size);
  v.window_size = positive(c, "window_size", v.window_size);
  v.fullatt_block_indexes = c.get_int_list("fullatt_block_indexes", v.fullatt_block_indexes);
  v.split_qkv = c.get_string("model_type", "") == "qwen2_5_omni_vision_encoder";

  require(v.hidden_size % v.num_heads == 0, c, "num_heads",
          "must divide hidden_size (" + std::to_string(v.hidden_size) + ")");
  v.head_dim = v.hidden_size / v.num_heads;
  require(v.head_dim % 4 == 0, c, "num_heads",
          "gives a head_dim (hidden_size / num_heads) of " + std::to_string(v.head_dim) +
              ", which the 2-D rope needs to be a multiple of 4");
  const std::string act = c.get_string("hidden_act", "silu");
  require(act == "silu", c, "hidden_act", "only silu is supported, got \"" + act + "\"");
  const int64_t merged_patch = v.spatial_merge_size * v.patch_size;
  require(v.window_size >= merged_patch, c, "window_size",
          "must hold at least one merged patch (spatial_merge_size * patch_size = " +
              std::to_string(merged_patch) + " pixels), got " + std::to_string(v.window_size));
  for (int64_t index : v.fullatt_block_indexes) {
    require(index >= 0, c, "fullatt_block_indexes",
            "block indexes must be >= 0, got " + std::to_string(index));
  }
  const std::string rope_type = c.get_string("rope_parameters.rope_type", "axial");
  require(rope_type == "axial", c, "rope_parameters.rope_type",
          "the vision rope is axial, got \"" + rope_type + "\"");
  v.rope_theta = c.get_double("rope_parameters.rope_theta", v.rope_theta);
  require(v.rope_theta > 0, c, "rope_parameters.rope_theta", "must be > 0");
  return v;
}

VisionConfig VisionConfig::load(const std::string& dir) { return parse(HfConfig::load(dir)); }

ImageTokenIds ImageTokenIds::parse(const HfConfig& json) {
  ImageTokenIds ids;
  for (auto [field, id] : {std::pair{"image_token_id", &ids.image_token_id},
                           std::pair{"video_token_id", &ids.video_token_id},
                           std::pair{"vision_start_token_id", &ids.vision_start_token_id},
                           std::pair{"vision_end_token_id", &ids.vision_end_token_id}}) {
    *id = json.get_int(field, *id);
    require(*id >= 0, json, field, "must be >= 0, got " + std::to_string(*id));
  }
  return ids;
}

ImageTokenIds ImageTokenIds::load(const std::string& dir) { return parse(HfConfig::load(dir)); }

}  // namespace omni::models::qwen2_5
