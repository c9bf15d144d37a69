#include <memory>
#include <string>

#include "model_runner/qwen2_5/vision_tower.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models::qwen2_5 {

std::string vision_prefix(const SafetensorsCheckpoint& checkpoint, const std::string& root) {
  // As decoder_prefix: one mapping for both layouts, the tower's own names never change.
  const std::string nested = root + "model.visual.";
  return checkpoint.has(nested + "patch_embed.proj.weight") ? nested : root + "visual.";
}

std::shared_ptr<VisionTower> load_vision_tower(const std::string& dir, at::ScalarType dtype) {
  auto config = VisionConfig::load(dir);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  const std::string prefix = vision_prefix(checkpoint);
  if (checkpoint.has(prefix + "blocks.0.attn.q.weight")) config.split_qkv = true;
  auto model = std::make_shared<VisionTower>(config, resolve_dtype(dtype, checkpoint, prefix));
  load_weights(*model, checkpoint, prefix);
  return model;
}

}  // namespace omni::models::qwen2_5
