// The request the pipeline suites run on the tiny Qwen3-Omni fixture: a system turn, text and
// (with media) audio and an image in; greedy, 12 thinker tokens, 10 talker frames.
#pragma once

#include <string>

#include "model_runner/runner/omni_request.h"

namespace omni::testing {

inline models::OmniRequest tiny_request(const std::string& fixture_dir, bool media = true) {
  models::OmniRequest r;
  r.chat.system_prompt = "You are a helpful voice.";
  r.chat.text = "What do you hear and see?";
  if (media) {
    r.chat.audio_files = {fixture_dir + "/audio.wav"};
    r.chat.image_files = {fixture_dir + "/image.png"};
  }
  r.sampling.set_greedy(true);
  r.sampling.thinker.max_new_tokens = 12;
  r.max_audio_frames = 10;
  return r;
}

}  // namespace omni::testing
