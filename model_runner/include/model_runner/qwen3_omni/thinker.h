// The Qwen3-Omni thinker (Hugging Face Qwen3OmniMoeThinkerForConditionalGeneration): audio
// tower, vision encoder, MoE text decoder and lm_head, with the module tree of the checkpoint
// ("thinker.audio_tower.*", "thinker.visual.*", "thinker.model.*", "thinker.lm_head.*"), so
// load_weights binds tensors by name and offload paths read like the checkpoint
// ("audio_tower", "visual", "model.layers").
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "model_runner/layers.h"
#include "model_runner/qwen3_omni/audio_encoder.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/rope_index.h"
#include "model_runner/qwen3_omni/text_model.h"
#include "model_runner/qwen3_omni/vision_encoder.h"

namespace omni::models::qwen3_omni {

// One prompt: token ids with audio / image placeholder runs already expanded to the number of
// tokens each input makes (audio_output_length, t*h*w / merge^2), and the inputs themselves.
struct ThinkerInputs {
  std::vector<int64_t> input_ids;
  at::Tensor audio_features;           // [num_mel_bins, sum(audio_lengths)] float32, or undefined
  std::vector<int64_t> audio_lengths;  // mel frames per clip
  at::Tensor pixel_values;             // [patches, C*T*P*P] float32, or undefined
  std::vector<std::array<int64_t, 3>> image_grids;  // (t, h, w) in patches, per image
};

// Per-request decoding state.
struct ThinkerState {
  explicit ThinkerState(int64_t num_layers) : cache(num_layers) {}
  KvCache cache;
  int64_t rope_delta = 0;
  // What the talker reads (Hugging Face's hidden_states over a generate): when capture_layer
  // >= 0, every prefill / decode appends its rows (on the compute device) of
  // hidden_states[0] (the input embeddings, multimodal features merged in) to `embeds` and of
  // hidden_states[capture_layer] to `hidden`.
  int64_t capture_layer = -1;
  std::vector<at::Tensor> embeds, hidden;
};

// A prompt ready to run in chunks (chunked prefill): its input embeddings with the audio and
// image features merged in, its M-RoPE positions and DeepStack inputs, on the compute device.
// The first `done` rows have run into the state's cache.
struct PromptChunks {
  at::Tensor embeds;         // [L, hidden]
  at::Tensor position_ids;   // [3, L] int64 (CPU)
  DeepStackInput deepstack;  // features empty without images
  int64_t length = 0, done = 0;
  int64_t remaining() const { return length - done; }
};

// A HookableModule whose hooked methods (prefill, decode, embed) cover every use of its weights,
// so that the whole thinker can be one offload component ("thinker").
class Thinker : public offload::HookableModule {
 public:
  Thinker(const ThinkerConfig& cfg, at::ScalarType dtype);

  // Runs the prompt into `state` (which must be fresh). Returns logits [L, vocab] for every
  // position when `all_logits`, else [1, vocab] for the last one; float32 on the CPU.
  at::Tensor prefill(const ThinkerInputs& inputs, ThinkerState& state, bool all_logits = false);
  // The same prefill in parts: prepare_prompt runs the encoders (a fresh `state` takes the
  // prompt's rope delta); each prefill_chunk runs the next `max_tokens` rows into the cache and
  // returns the last row's logits [1, vocab] once the prompt is done (undefined before). Whole
  // in one chunk, it is prefill's forward op for op.
  PromptChunks prepare_prompt(const ThinkerInputs& inputs, ThinkerState& state);
  at::Tensor prefill_chunk(PromptChunks& prompt, ThinkerState& state, int64_t max_tokens);
  // One generated token -> logits [vocab] for the next one (float32, CPU).
  at::Tensor decode(int64_t token, ThinkerState& state);
  // One decode step of several sequences: tokens[b] continues states[b] (each prefilled, of
  // any length) -> logits [B, vocab] (float32, CPU). Every weight is used once for the batch.
  // States that capture rows for a talker must all capture the same layer.
  at::Tensor decode_batch(const std::vector<int64_t>& tokens,
                          const std::vector<ThinkerState*>& states);
  // Rows of the token embedding table for `ids` (on the compute device): what the talker's
  // hand-off reads for its special tokens.
  at::Tensor embed(const std::vector<int64_t>& ids);

  // Where compute happens (the offload engine's compute device); inputs are moved there.
  void set_device(c10::Device device) { device_ = device; }
  c10::Device device() const { return device_; }
  const ThinkerConfig& config() const { return cfg_; }
  AudioEncoder& audio_tower() { return *audio_tower_; }
  VisionEncoder& visual() { return *visual_; }
  TextModel& language_model() { return *model_; }
  ThinkerState new_state(int64_t capture_layer = -1) const {
    ThinkerState state(cfg_.text.num_hidden_layers);
    state.capture_layer = capture_layer;
    return state;
  }

 private:
  at::Tensor logits(const at::Tensor& hidden);
  at::Tensor prefill_impl(const ThinkerInputs& inputs, ThinkerState& state, bool all_logits);
  PromptChunks prepare_impl(const ThinkerInputs& inputs, ThinkerState& state);
  // The next `n` rows of `prompt`: logits of every row when `all_logits`, else of the last.
  at::Tensor chunk_impl(PromptChunks& prompt, ThinkerState& state, int64_t n, bool all_logits);
  at::Tensor decode_impl(const std::vector<int64_t>& tokens,
                         const std::vector<ThinkerState*>& states);

  ThinkerConfig cfg_;
  c10::Device device_{c10::kCPU};
  std::shared_ptr<AudioEncoder> audio_tower_;
  std::shared_ptr<VisionEncoder> visual_;
  std::shared_ptr<TextModel> model_;
  std::shared_ptr<HookableLinear> lm_head_;  // null when tied to the embedding
};

}  // namespace omni::models::qwen3_omni
