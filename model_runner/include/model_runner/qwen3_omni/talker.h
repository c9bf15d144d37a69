// The Qwen3-Omni talker ("talker.*" tensors of Qwen3OmniMoeForConditionalGeneration): an MoE
// decoder (every layer routed experts + a sigmoid-gated shared expert, q/k norm, interleaved 3-D
// rope) that emits codec group 0 of each 80 ms frame, the projections that map the thinker's
// rows into its space, and the code predictor that fills groups 1..15 of each frame.
//
// The module tree is the checkpoint's, so load_weights binds tensors by name and offload paths
// read like the checkpoint: talker.model.layers.N, talker.text_projection, talker.codec_head,
// talker.code_predictor. Every use of a weight goes through a hooked method of the module that
// owns it, so any of these (or the whole talker) can be an offload component.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/layers.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/qwen3_omni/text_model.h"

namespace omni::models::qwen3_omni {

// Linear -> SiLU -> Linear with biases: maps thinker rows (thinker hidden size) to the talker's.
class ResizeMlp : public offload::HookableModule {
 public:
  ResizeMlp(int64_t in, int64_t intermediate, int64_t out, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<Linear> linear_fc1_, linear_fc2_;
};

// The code predictor's decoder ("talker.code_predictor.model"): dense Qwen3 layers with 1-D rope
// and one codec embedding table per residual group (table k embeds code k + 1).
class CodePredictorModel : public torch::nn::Module {
 public:
  CodePredictorModel(const CodePredictorConfig& cfg, at::ScalarType dtype);
  // embeds [B, L, hidden] at positions cache->length() .. + L - 1 -> normalized [B, L, hidden].
  at::Tensor forward(const at::Tensor& embeds, KvCache* cache);
  // The same with the rotary tables of positions 0 .. n - 1 computed once (rope_table(n)): a
  // frame's 15 forwards share them, and each slice is bitwise what forward() computes.
  at::Tensor forward(const at::Tensor& embeds, const std::pair<at::Tensor, at::Tensor>& table,
                     KvCache* cache);
  std::pair<at::Tensor, at::Tensor> rope_table(int64_t n, const at::TensorOptions& like) const;
  at::Tensor embed(int64_t table, const at::Tensor& ids);

 private:
  CodePredictorConfig cfg_;
  std::vector<std::shared_ptr<DecoderLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::vector<std::shared_ptr<Embedding>> codec_embedding_;
};

// "talker.code_predictor": codes 1..num_code_groups-1 of a frame, one at a time, with a fresh
// KV cache per frame, exactly as the reference's code_predictor.generate.
class CodePredictor : public offload::HookableModule {
 public:
  CodePredictor(const CodePredictorConfig& cfg, at::ScalarType dtype);
  struct Frame {
    std::vector<int64_t> codes;  // groups 1..num_code_groups-1
    // The codec embeddings the talker adds for them: table k - 1 of code k, [groups - 1, hidden].
    at::Tensor embeds;
  };
  // `talker_hidden` [hidden]: the talker's normalized last hidden state; `code0_embed` [hidden]:
  // the talker's codec embedding of group 0. When `logits` is given, each step's logits
  // ([vocab] float32 CPU) are appended to it.
  Frame predict(const at::Tensor& talker_hidden, const at::Tensor& code0_embed, Sampler& sampler,
                std::vector<at::Tensor>* logits = nullptr);
  struct FrameBatch {
    std::vector<std::vector<int64_t>> codes;  // per row: groups 1..num_code_groups-1
    at::Tensor embeds;                        // [B, groups - 1, hidden]
  };
  // The frames of a batch: row b of `talker_hidden` / `code0_embed` [B, hidden] sampled with
  // samplers[b]. The rows share one forward per group (every frame has the same length).
  FrameBatch predict_batch(const at::Tensor& talker_hidden, const at::Tensor& code0_embed,
                           const std::vector<Sampler*>& samplers,
                           std::vector<at::Tensor>* logits = nullptr);
  const CodePredictorConfig& config() const { return cfg_; }

 private:
  CodePredictorConfig cfg_;
  std::shared_ptr<CodePredictorModel> model_;
  std::vector<std::shared_ptr<Linear>> lm_head_;
};

// Per-request talker state.
struct TalkerState {
  explicit TalkerState(int64_t num_layers) : cache(num_layers) {}
  KvCache cache;
  int64_t rope_delta = 0;
  at::Tensor last_hidden;  // [hidden]: normalized output at the last position
  // Projected text rows, one per step ([hidden] each). While the thinker still streams its
  // answer (trailing_complete false) rows are appended as they become known (add_trailing);
  // a step that needs a row not yet there is an error.
  std::vector<at::Tensor> trailing;
  bool trailing_complete = true;
  at::Tensor tts_pad;            // [hidden]: added once the trailing rows are used up
  int64_t step = 0;              // frames fed back so far
  double code_predictor_ms = 0;  // time spent in the code predictor (for the stats)
};

class Talker : public offload::HookableModule {
 public:
  Talker(const TalkerConfig& cfg, at::ScalarType dtype);

  // The hand-off's rows in the talker's space (on the compute device).
  struct ProjectedPrompt {
    at::Tensor embeds;    // [Lt, hidden]: the prefill input
    at::Tensor trailing;  // [n, hidden] (each row projected alone); may be empty (n = 0)
    at::Tensor tts_pad;   // [hidden]
  };
  // text_projection / hidden_projection of the thinker rows, plus the codec embeddings.
  ProjectedPrompt project(const TalkerPrompt& prompt);
  // project() then prefill_embeds().
  at::Tensor prefill(const TalkerPrompt& prompt,
                     const std::vector<std::array<int64_t, 3>>& image_grids, TalkerState& state);
  // Runs the prompt with 3-D rope from its input ids (`image_grids`: the prompt's images) and
  // returns the logits [vocab] (float32, CPU) for group 0 of the first frame.
  at::Tensor prefill_embeds(const ProjectedPrompt& prompt, const std::vector<int64_t>& input_ids,
                            const std::vector<std::array<int64_t, 3>>& image_grids,
                            TalkerState& state);
  // Appends text rows (thinker space, [k, thinker hidden]) to the state's trailing rows, each
  // projected alone (as project() projects them, so that streamed and whole hand-offs give the
  // same numbers); `complete`: no more rows will come (tts_pad follows them).
  void add_trailing(const at::Tensor& rows, bool complete, TalkerState& state);
  // Feeds back group 0 of the last frame: the code predictor fills the frame's other groups, the
  // frame's embeddings plus the next text row (or tts_pad) run through the decoder. Returns the
  // whole frame (num_code_groups codes) and writes the logits [vocab] (float32, CPU) for the
  // next frame's group 0 to `next_logits`.
  std::vector<int64_t> step(int64_t code0, TalkerState& state, Sampler& code_predictor_sampler,
                            at::Tensor& next_logits,
                            std::vector<at::Tensor>* code_predictor_logits = nullptr);
  // One step of several talker sequences: codes0[b] feeds back states[b] (each prefilled, of
  // any length), its code predictor drawing with samplers[b]. Returns the frames and writes the
  // next logits [B, vocab] (float32, CPU). The weights run once for the batch.
  std::vector<std::vector<int64_t>> step_batch(
      const std::vector<int64_t>& codes0, const std::vector<TalkerState*>& states,
      const std::vector<Sampler*>& samplers, at::Tensor& next_logits,
      std::vector<at::Tensor>* code_predictor_logits = nullptr);

  TalkerState new_state() const { return TalkerState(cfg_.text.num_hidden_layers); }
  const TalkerConfig& config() const { return cfg_; }
  void set_device(c10::Device device) { device_ = device; }
  c10::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  TextModel& model() { return *model_; }
  CodePredictor& code_predictor() { return *code_predictor_; }

 private:
  at::Tensor logits(const at::Tensor& hidden);
  // text_projection of each row of `rows` alone -> [k, hidden].
  at::Tensor project_text_rows(const at::Tensor& rows);
  void check_prompt(const TalkerPrompt& prompt) const;
  ProjectedPrompt project_impl(const TalkerPrompt& prompt);
  at::Tensor prefill_impl(const ProjectedPrompt& prompt, const std::vector<int64_t>& input_ids,
                          const std::vector<std::array<int64_t, 3>>& image_grids,
                          TalkerState& state);

  TalkerConfig cfg_;
  at::ScalarType dtype_;
  c10::Device device_{c10::kCPU};
  std::shared_ptr<TextModel> model_;
  std::shared_ptr<ResizeMlp> text_projection_, hidden_projection_;
  std::shared_ptr<HookableLinear> codec_head_;
  std::shared_ptr<CodePredictor> code_predictor_;
};

// The ids of the talker vocabulary that may not be sampled: the top 1024 (special codec ids)
// except codec EOS, as the reference suppresses them.
std::vector<int64_t> talker_suppressed_tokens(const TalkerConfig& cfg);
// The codec id of a speaker name (any case); throws listing the known names.
int64_t speaker_codec_id(const TalkerConfig& cfg, const std::string& name);

}  // namespace omni::models::qwen3_omni
