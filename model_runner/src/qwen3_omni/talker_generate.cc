#include "model_runner/qwen3_omni/talker_generate.h"

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

TalkerDecode::TalkerDecode(const TalkerConfig& tc, SamplingParams talker_params,
                           SamplingParams code_predictor_params, int64_t max_frames)
    : eos_(tc.codec_eos_token_id),
      max_codes_(max_frames + 1),
      sampler_([&] {
        OMNI_CHECK(max_frames >= 1, "max_audio_frames must be >= 1, got ", max_frames);
        // Each frame takes one position of the talker's context (checked before max_frames + 1).
        const int64_t context = tc.text.max_position_embeddings;
        OMNI_CHECK(context == 0 || max_frames <= context, "max_audio_frames (", max_frames,
                   ") exceeds the talker's context of ", context, " positions");
        talker_params.suppress_tokens = talker_suppressed_tokens(tc);
        talker_params.stop_token_ids = {tc.codec_eos_token_id};
        talker_params.max_new_tokens = max_frames + 1;
        return talker_params;
      }()),
      cp_sampler_([&] {
        code_predictor_params.greedy = sampler_.params().is_greedy();
        return code_predictor_params;
      }()) {
  run_.finish_reason = "length";
}

void TalkerDecode::start(const at::Tensor& logits) { sample(logits); }

void TalkerDecode::stepped(std::vector<int64_t> frame, const at::Tensor& logits) {
  run_.frames.push_back(std::move(frame));
  sample(logits);
}

void TalkerDecode::stepped_batch(const std::vector<TalkerDecode*>& decodes,
                                 std::vector<std::vector<int64_t>> frames,
                                 const at::Tensor& logits) {
  OMNI_CHECK(frames.size() == decodes.size(), "TalkerDecode::stepped_batch: ", frames.size(),
             " frames for ", decodes.size(), " decodes");
  std::vector<Sampler*> samplers;
  std::vector<const std::vector<int64_t>*> contexts;
  for (size_t i = 0; i < decodes.size(); ++i) {
    decodes[i]->run_.frames.push_back(std::move(frames[i]));
    samplers.push_back(&decodes[i]->sampler_);
    contexts.push_back(&decodes[i]->codes0_);
  }
  const auto codes = Sampler::sample_rows(samplers, logits, contexts);
  for (size_t i = 0; i < decodes.size(); ++i) decodes[i]->sampled(codes[i]);
}

void TalkerDecode::sample(const at::Tensor& logits) { sampled(sampler_.sample(logits, codes0_)); }

void TalkerDecode::sampled(int64_t code) {
  codes0_.push_back(code);
  if (code == eos_) return finish("stop");
  if (static_cast<int64_t>(codes0_.size()) >= max_codes_) finish("length");
}

void TalkerDecode::finish(const char* reason) {
  run_.finish_reason = reason;
  done_ = true;
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
