#include "model_runner/qwen3_omni/omni_model.h"

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

Qwen3Omni::Qwen3Omni(const ThinkerConfig& thinker, const TalkerConfig* talker,
                     const Code2WavConfig* code2wav, at::ScalarType dtype)
    : torch::nn::Module("Qwen3Omni") {
  OMNI_CHECK((talker == nullptr) == (code2wav == nullptr),
             "Qwen3Omni: the talker and code2wav come together");
  thinker_ = register_module("thinker", std::make_shared<Thinker>(thinker, dtype));
  if (talker) {
    talker_ = register_module("talker", std::make_shared<Talker>(*talker, dtype));
    code2wav_ = register_module("code2wav", std::make_shared<Code2Wav>(*code2wav, dtype));
  }
}

Talker& Qwen3Omni::talker() {
  OMNI_CHECK(talker_ != nullptr, "this checkpoint has no talker (text output only)");
  return *talker_;
}

Code2Wav& Qwen3Omni::code2wav() {
  OMNI_CHECK(code2wav_ != nullptr, "this checkpoint has no code2wav (text output only)");
  return *code2wav_;
}

void Qwen3Omni::set_device(c10::Device device) {
  thinker_->set_device(device);
  if (talker_) talker_->set_device(device);
}

}  // namespace omni::models::qwen3_omni
