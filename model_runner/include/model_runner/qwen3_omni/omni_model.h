// The whole Qwen3OmniMoeForConditionalGeneration as one module tree, named as the checkpoint:
// "thinker", and with speech output "talker" and "code2wav". One offload backend over this root
// can move the parts against each other (component offload of thinker,talker).
#pragma once

#include <memory>

#include "model_runner/qwen3_omni/code2wav.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/talker.h"
#include "model_runner/qwen3_omni/thinker.h"

namespace omni::models::qwen3_omni {

class Qwen3Omni : public torch::nn::Module {
 public:
  // `talker` / `code2wav` null: a text-only model.
  Qwen3Omni(const ThinkerConfig& thinker, const TalkerConfig* talker,
            const Code2WavConfig* code2wav, at::ScalarType dtype);

  Thinker& thinker() { return *thinker_; }
  bool has_talker() const { return talker_ != nullptr; }
  Talker& talker();
  Code2Wav& code2wav();
  void set_device(c10::Device device);

 private:
  std::shared_ptr<Thinker> thinker_;
  std::shared_ptr<Talker> talker_;
  std::shared_ptr<Code2Wav> code2wav_;
};

}  // namespace omni::models::qwen3_omni
