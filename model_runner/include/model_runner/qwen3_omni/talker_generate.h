// The talker's generation loop over a built hand-off (the only one: TalkerRunner runs it for
// the talker stage): group 0 from the talker (suppressed special ids, codec EOS
// stops), groups 1..15 from the code predictor, the last code sampled within the cap never fed
// back (as the reference).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/talker.h"
#include "model_runner/qwen3_omni/talker_handoff.h"

namespace omni::models::qwen3_omni {

struct TalkerRun {
  std::vector<std::vector<int64_t>> frames;  // each num_code_groups codes, group 0 first
  std::string finish_reason;                 // stop (codec EOS) | length | cancelled
  double talker_ms = 0;                      // prefill + every step (callbacks excluded)
  double code_predictor_ms = 0;              // of talker_ms
};

// `talker_params`: the request's talker sampling (suppressed ids, stop token and cap are set
// here); `code_predictor_params` follow the talker's greedy flag (the reference since
// transformers 5.15). `on_frame` sees each frame as it is made; false cancels.
// `feed_text`, for a hand-off still streaming in: `prompt` then holds the prefill only, and
// feed_text is called before each step to add that step's text row to the state
// (Talker::add_trailing) or to mark the text complete; without it the prompt is whole.
// `batched`, when set, takes the model calls: `with_model` runs the prefill under the model's
// lock and `step` stands for Talker::step (models::TalkerBatcher batches it with other
// requests'); feed_text then makes its own model calls through the same lock.
struct TalkerCalls {
  std::function<void(const std::function<void()>&)> with_model;
  std::function<std::vector<int64_t>(int64_t code0, TalkerState& state, Sampler& sampler,
                                     at::Tensor& next_logits)>
      step;
};
TalkerRun run_talker(Talker& talker, const TalkerPrompt& prompt,
                     const std::vector<std::array<int64_t, 3>>& image_grids,
                     SamplingParams talker_params, SamplingParams code_predictor_params,
                     int64_t max_frames,
                     const std::function<bool(const std::vector<int64_t>&)>& on_frame,
                     const std::function<void(TalkerState&)>& feed_text = nullptr,
                     const TalkerCalls* batched = nullptr);

// The hand-off's ids for `speaker` (a codec id) from the checkpoint's configs.
HandoffIds handoff_ids(const ThinkerConfig& thinker, const TalkerConfig& talker,
                       const OmniTokenIds& ids, int64_t speaker,
                       const std::vector<int64_t>& thinker_stop_tokens);

}  // namespace omni::models::qwen3_omni
