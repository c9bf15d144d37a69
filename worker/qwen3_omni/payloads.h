// What Qwen3-Omni's kinds hand on beyond text, codec frames and audio chunks (StagePacket's
// payload): the thinker's rows for the talker, and code2wav's whole decoded waveform. Each
// names its tensors on the wire in one place, here; the stages read and write the structs.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "worker/pipeline/stage.h"

namespace omni::pipeline {

// One thinker packet's hand-off to the talker (with ThinkerParams::handoff): the first also
// carries the prompt (its ids, the TTS special embeddings, the thinker's stop tokens, the
// images' grids); every one the rows of hidden_states[0] and [accept_hidden_layer] that the
// forward before it appended.
struct ThinkerRows : Payload {
  bool first = false;  // the prompt's fields below are set
  std::vector<int64_t> prompt_ids;
  at::Tensor tts_embeds;  // [3, H]
  std::vector<int64_t> stop_tokens;
  std::vector<std::array<int64_t, 3>> image_grids;  // (t, h, w) per image
  at::Tensor embeds, hidden;                        // [n, H] each; undefined: no new rows

  NamedTensors tensors() const override;
  static ThinkerRows read(const NamedTensors& wire);  // throws omni::Error on a malformed one
};

// code2wav's last packet: the reference's decode of all frames (chunks of 300, 25 of context).
struct DecodedWaveform : Payload {
  at::Tensor waveform;  // [samples] float32

  NamedTensors tensors() const override { return {{"waveform", waveform}}; }
  static DecodedWaveform read(const NamedTensors& wire);
};

}  // namespace omni::pipeline
