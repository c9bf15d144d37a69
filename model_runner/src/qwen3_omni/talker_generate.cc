#include "model_runner/qwen3_omni/talker_generate.h"

#include <chrono>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

TalkerRun run_talker(Talker& talker, const TalkerPrompt& prompt,
                     const std::vector<std::array<int64_t, 3>>& image_grids,
                     SamplingParams talker_params, SamplingParams code_predictor_params,
                     int64_t max_frames,
                     const std::function<bool(const std::vector<int64_t>&)>& on_frame,
                     const std::function<void(TalkerState&)>& feed_text,
                     const TalkerCalls* batched) {
  using Clock = std::chrono::steady_clock;
  OMNI_CHECK(max_frames >= 1, "max_audio_frames must be >= 1, got ", max_frames);
  const auto& tc = talker.config();
  // Each frame takes one position of the talker's context (checked before max_frames + 1).
  const int64_t context = tc.text.max_position_embeddings;
  OMNI_CHECK(context == 0 || max_frames <= context, "max_audio_frames (", max_frames,
             ") exceeds the talker's context of ", context, " positions");
  talker_params.suppress_tokens = talker_suppressed_tokens(tc);
  talker_params.stop_token_ids = {tc.codec_eos_token_id};
  talker_params.max_new_tokens = max_frames + 1;
  code_predictor_params.greedy = talker_params.is_greedy();
  Sampler talker_sampler(talker_params);
  Sampler cp_sampler(code_predictor_params);

  TalkerRun run;
  double callback_ms = 0;
  const auto start = Clock::now();
  auto state = talker.new_state();
  at::Tensor logits;
  const auto prefill = [&] { logits = talker.prefill(prompt, image_grids, state); };
  batched ? batched->with_model(prefill) : prefill();
  if (feed_text) state.trailing_complete = false;
  std::vector<int64_t> codes0;
  run.finish_reason = "length";
  while (true) {
    const int64_t code = talker_sampler.sample(logits, codes0);
    codes0.push_back(code);
    if (code == tc.codec_eos_token_id) {
      run.finish_reason = "stop";
      break;
    }
    // The last code sampled within the cap is never fed back: it has no frame (as HF).
    if (static_cast<int64_t>(codes0.size()) >= talker_params.max_new_tokens) break;
    if (feed_text) {
      const auto feed_start = Clock::now();
      feed_text(state);  // may wait for the thinker: not talker time
      callback_ms += std::chrono::duration<double, std::milli>(Clock::now() - feed_start).count();
    }
    run.frames.push_back(batched ? batched->step(code, state, cp_sampler, logits)
                                 : talker.step(code, state, cp_sampler, logits));
    if (on_frame) {
      const auto callback_start = Clock::now();
      const bool go_on = on_frame(run.frames.back());
      callback_ms +=
          std::chrono::duration<double, std::milli>(Clock::now() - callback_start).count();
      if (!go_on) {
        run.finish_reason = "cancelled";
        break;
      }
    }
  }
  run.talker_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() - callback_ms;
  run.code_predictor_ms = state.code_predictor_ms;
  return run;
}

HandoffIds handoff_ids(const ThinkerConfig& thinker, const TalkerConfig& tc,
                       const OmniTokenIds& ids, int64_t speaker,
                       const std::vector<int64_t>& thinker_stop_tokens) {
  HandoffIds h;
  h.im_start = ids.im_start;
  h.user = ids.user;
  h.assistant = ids.assistant;
  h.tts_pad = ids.tts_pad;
  h.multimodal = {thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id};
  h.thinker_eos = thinker_stop_tokens;
  h.codec_prefix = {tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id, speaker,
                    tc.codec_pad_id,     tc.codec_bos_id};
  return h;
}

}  // namespace omni::models::qwen3_omni
