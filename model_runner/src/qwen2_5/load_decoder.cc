#include <memory>
#include <string>

#include "model_runner/qwen2_5/decoder.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models::qwen2_5 {

std::string decoder_prefix(const SafetensorsCheckpoint& checkpoint, const std::string& root) {
  // One mapping for both layouts: the decoder's own names never change, only where it hangs.
  const std::string nested = root + "model.language_model.";
  return checkpoint.has(nested + "embed_tokens.weight") ? nested : root + "model.";
}

std::shared_ptr<TextDecoder> load_text_decoder(const std::string& dir, at::ScalarType dtype) {
  const auto config = TextConfig::load(dir);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  const std::string prefix = decoder_prefix(checkpoint);
  auto model = std::make_shared<TextDecoder>(config, resolve_dtype(dtype, checkpoint, prefix));
  load_weights(*model, checkpoint, prefix);
  return model;
}

}  // namespace omni::models::qwen2_5
