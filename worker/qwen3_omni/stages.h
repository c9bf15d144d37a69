// The in-process stages of Qwen3-Omni's kinds (family.cc registers them).
//
// Packets each stage writes (tensors float32/the model's dtype on the CPU):
//   thinker   first packet: the first token and its text, and with `handoff` the prompt's rows:
//             "prompt_ids" [L] int64, "embeds" / "hidden" [L, H], "tts_embeds" [3, H],
//             "stop_tokens" [s] int64, "image_grids" [k, 3] int64; then one packet per token
//             with the rows of the token fed back before it ("embeds" / "hidden" [1, H]); the
//             last packet is `finished` (reason stop | length | cancelled) with metrics.
//   talker    one packet per codec frame; the last `finished` (stop | length | cancelled |
//             none when the thinker said too little to speak).
//   code2wav  one packet per decoded chunk (`audio`); the last `finished`, with the reference
//             decode of all frames as "waveform" when asked for.
#pragma once

#include <memory>

#include "worker/pipeline/local_stages.h"

namespace omni::pipeline::local {

std::unique_ptr<Stage> make_thinker_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_talker_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_code2wav_stage(const LocalStageOptions& options);

}  // namespace omni::pipeline::local
