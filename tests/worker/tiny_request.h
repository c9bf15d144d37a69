// The request the pipeline suites run on the tiny Qwen3-Omni fixture: a system turn, text and
// (with media) audio and an image in; greedy, 12 thinker tokens, 10 talker frames. And the
// request's Qwen3-Omni part, as the suites set and read it.
#pragma once

#include <string>

#include "model_runner/qwen3_omni/omni_options.h"
#include "worker/pipeline/request.h"

namespace omni::testing {

inline models::OmniOptions& omni(pipeline::Request& r) {
  return r.parts.get<models::OmniOptions>();
}
inline const models::OmniOptions& omni(const pipeline::Request& r) {
  static const models::OmniOptions defaults;
  const auto* part = r.parts.find<models::OmniOptions>();
  return part ? *part : defaults;
}

inline pipeline::Request tiny_request(const std::string& fixture_dir, bool media = true) {
  pipeline::Request r;
  r.chat.system_prompt = "You are a helpful voice.";
  r.chat.text = "What do you hear and see?";
  if (media) {
    r.chat.audio_files = {fixture_dir + "/audio.wav"};
    r.chat.image_files = {fixture_dir + "/image.png"};
  }
  omni(r).sampling.set_greedy(true);
  omni(r).sampling.thinker.max_new_tokens = 12;
  omni(r).max_audio_frames = 10;
  return r;
}

}  // namespace omni::testing
