// The talker's generation around its steps: group 0 from the talker (suppressed special ids,
// codec EOS stops), groups 1..15 from the code predictor (inside Talker::step), the last code
// sampled within the cap never fed back (as the reference).
#pragma once

#include <array>
#include <cstdint>
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
  double code_predictor_ms = 0;              // the code predictor's share of the steps
};

// One request's decode around the talker's steps (the talker stage's engine loop runs them, in
// a batch): group 0 sampled from the talker's logits (suppressed special ids, codec EOS stops,
// the generated codes as repetition context), the frames kept, the cap applied. `talker_params`:
// the request's talker sampling (suppressed ids, stop token and cap are set here);
// `code_predictor_params` follow the talker's greedy flag (the reference since transformers 5.15).
class TalkerDecode {
 public:
  // Throws on a max_frames the talker's context cannot hold.
  TalkerDecode(const TalkerConfig& tc, SamplingParams talker_params,
               SamplingParams code_predictor_params, int64_t max_frames);
  // The prefill's logits: samples the first code.
  void start(const at::Tensor& logits);
  // A step's frame (fed back code() first) and the logits after it: samples the next code.
  void stepped(std::vector<int64_t> frame, const at::Tensor& logits);
  // stepped() for the decodes of one batched step: decodes[i] gets frames[i] and row i of
  // `logits` [B, vocab], and draws what stepped() would draw for it alone; the samplers run
  // over the batch at once.
  static void stepped_batch(const std::vector<TalkerDecode*>& decodes,
                            std::vector<std::vector<int64_t>> frames, const at::Tensor& logits);
  // Ends the run now (the caller stopped it).
  void cancel() { finish("cancelled"); }

  bool done() const { return done_; }
  int64_t code() const { return codes0_.back(); }  // the code the next step feeds back
  Sampler& code_predictor_sampler() { return cp_sampler_; }
  const TalkerRun& run() const { return run_; }
  TalkerRun& run() { return run_; }

 private:
  void sample(const at::Tensor& logits);
  void sampled(int64_t code);  // keeps the code; EOS or the cap ends the run
  void finish(const char* reason);

  int64_t eos_;
  int64_t max_codes_;  // max_frames + 1: the last code sampled within the cap has no frame
  Sampler sampler_, cp_sampler_;
  std::vector<int64_t> codes0_;
  TalkerRun run_;
  bool done_ = false;
};

// The hand-off's ids for `speaker` (a codec id) from the checkpoint's configs.
HandoffIds handoff_ids(const ThinkerConfig& thinker, const TalkerConfig& talker,
                       const OmniTokenIds& ids, int64_t speaker,
                       const std::vector<int64_t>& thinker_stop_tokens);

}  // namespace omni::models::qwen3_omni
