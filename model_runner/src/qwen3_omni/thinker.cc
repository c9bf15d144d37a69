#include "model_runner/qwen3_omni/thinker.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

Thinker::Thinker(const ThinkerConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("Thinker", {"prefill", "decode", "embed"}), cfg_(cfg) {
  audio_tower_ = register_module("audio_tower", std::make_shared<AudioEncoder>(cfg.audio, dtype));
  visual_ = register_module("visual", std::make_shared<VisionEncoder>(cfg.vision, dtype));
  model_ = register_module("model", std::make_shared<TextModel>(cfg.text, dtype));
  if (!cfg.tie_word_embeddings) {
    lm_head_ = register_module(
        "lm_head",
        std::make_shared<HookableLinear>(cfg.text.hidden_size, cfg.text.vocab_size, dtype, false));
  }
}

at::Tensor Thinker::logits(const at::Tensor& hidden) {
  // Through the modules' hooked methods, so that lm_head and model can be offload components.
  const auto out = lm_head_ ? lm_head_->forward(hidden) : model_->tied_logits(hidden);
  return out.to(at::kFloat).cpu();
}

at::Tensor Thinker::prefill(const ThinkerInputs& in, ThinkerState& state, bool all_logits) {
  return invoke(
             "prefill", {},
             [&](offload::HookArgs&) -> c10::IValue { return prefill_impl(in, state, all_logits); })
      .toTensor();
}

at::Tensor Thinker::decode(int64_t token, ThinkerState& state) {
  return decode_batch({token}, {&state})[0];
}

at::Tensor Thinker::decode_batch(const std::vector<int64_t>& tokens,
                                 const std::vector<ThinkerState*>& states) {
  return invoke("decode", {},
                [&](offload::HookArgs&) -> c10::IValue { return decode_impl(tokens, states); })
      .toTensor();
}

at::Tensor Thinker::embed(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    OMNI_CHECK(id >= 0 && id < cfg_.text.vocab_size, "token ", id,
               " is outside the vocabulary [0, ", cfg_.text.vocab_size, ")");
  }
  const auto t = at::tensor(ids, at::kLong).to(device_);
  return invoke("embed", {}, [&](offload::HookArgs&) -> c10::IValue { return model_->embed(t); })
      .toTensor();
}

PromptChunks Thinker::prepare_prompt(const ThinkerInputs& in, ThinkerState& state) {
  PromptChunks prompt;
  invoke("prefill", {}, [&](offload::HookArgs&) -> c10::IValue {
    prompt = prepare_impl(in, state);
    return {};
  });
  return prompt;
}

at::Tensor Thinker::prefill_chunk(PromptChunks& prompt, ThinkerState& state, int64_t max_tokens) {
  OMNI_CHECK(max_tokens > 0 && prompt.remaining() > 0, "prefill_chunk: ", prompt.remaining(),
             " prompt rows left, ", max_tokens, " asked for");
  const int64_t n = std::min(max_tokens, prompt.remaining());
  return invoke("prefill", {},
                [&](offload::HookArgs&) -> c10::IValue {
                  const auto logits = chunk_impl(prompt, state, n, false);
                  return prompt.remaining() == 0 ? logits : at::Tensor();
                })
      .toTensor();
}

at::Tensor Thinker::prefill_impl(const ThinkerInputs& in, ThinkerState& state, bool all_logits) {
  PromptChunks prompt = prepare_impl(in, state);
  return chunk_impl(prompt, state, prompt.length, all_logits);
}

PromptChunks Thinker::prepare_impl(const ThinkerInputs& in, ThinkerState& state) {
  OMNI_CHECK(state.cache.length() == 0, "prefill needs a fresh ThinkerState");
  OMNI_CHECK(!in.input_ids.empty(), "the prompt is empty");
  const int64_t n = static_cast<int64_t>(in.input_ids.size());
  for (int64_t i = 0; i < n; ++i) {
    OMNI_CHECK(in.input_ids[i] >= 0 && in.input_ids[i] < cfg_.text.vocab_size, "prompt token ", i,
               " is ", in.input_ids[i], ", outside the vocabulary [0, ", cfg_.text.vocab_size, ")");
  }
  PromptChunks prompt;
  prompt.length = n;
  auto ids_cpu = at::tensor(in.input_ids, at::kLong);
  auto ids = ids_cpu.to(device_);
  auto embeds = model_->embed(ids);  // [L, hidden]

  auto positions_of = [&](int64_t token) { return at::nonzero(ids_cpu == token).squeeze(1); };
  auto audio_pos = positions_of(cfg_.audio_token_id);
  if (in.audio_features.defined()) {
    auto features = audio_tower_->forward(in.audio_features.to(device_), in.audio_lengths);
    OMNI_CHECK(features.size(0) == audio_pos.size(0), "the audio makes ", features.size(0),
               " tokens, the prompt has ", audio_pos.size(0), " audio placeholder tokens");
    embeds.index_copy_(0, audio_pos.to(device_), features.to(embeds.scalar_type()));
  } else {
    OMNI_CHECK(audio_pos.size(0) == 0, "the prompt has ", audio_pos.size(0),
               " audio tokens but no audio was given");
  }

  auto image_pos = positions_of(cfg_.image_token_id);
  if (in.pixel_values.defined()) {
    auto vision = visual_->forward(in.pixel_values.to(device_), in.image_grids);
    OMNI_CHECK(vision.embeds.size(0) == image_pos.size(0), "the images make ",
               vision.embeds.size(0), " tokens, the prompt has ", image_pos.size(0),
               " image placeholder tokens");
    embeds.index_copy_(0, image_pos.to(device_), vision.embeds.to(embeds.scalar_type()));
    prompt.deepstack.visual_mask = (ids_cpu == cfg_.image_token_id).to(device_);
    prompt.deepstack.features = std::move(vision.deepstack);
  } else {
    OMNI_CHECK(image_pos.size(0) == 0, "the prompt has ", image_pos.size(0),
               " image tokens but no image was given");
  }

  auto rope = rope_positions(cfg_, in.input_ids, in.image_grids);
  state.rope_delta = rope.rope_delta;
  prompt.embeds = std::move(embeds);
  prompt.position_ids = std::move(rope.position_ids);
  return prompt;
}

at::Tensor Thinker::chunk_impl(PromptChunks& prompt, ThinkerState& state, int64_t n,
                               bool all_logits) {
  const int64_t start = prompt.done;
  const bool whole = start == 0 && n == prompt.length;
  const auto embeds = whole ? prompt.embeds : prompt.embeds.narrow(0, start, n);
  const auto positions = whole ? prompt.position_ids : prompt.position_ids.narrow(1, start, n);
  // The DeepStack rows of the chunk's image tokens: the features' rows continue where the
  // earlier chunks' image tokens ended.
  DeepStackInput chunk_deepstack;
  const DeepStackInput* deepstack = nullptr;
  if (!prompt.deepstack.features.empty()) {
    if (whole) {
      deepstack = &prompt.deepstack;
    } else {
      const auto& mask = prompt.deepstack.visual_mask;
      const int64_t before = mask.narrow(0, 0, start).sum().item<int64_t>();
      chunk_deepstack.visual_mask = mask.narrow(0, start, n);
      const int64_t count = chunk_deepstack.visual_mask.sum().item<int64_t>();
      if (count > 0) {
        for (const auto& f : prompt.deepstack.features) {
          chunk_deepstack.features.push_back(f.narrow(0, before, count));
        }
        deepstack = &chunk_deepstack;
      }
    }
  }
  HiddenCapture capture{state.capture_layer, {}};
  auto hidden = model_->forward(embeds.unsqueeze(0), positions.to(device_), &state.cache, deepstack,
                                state.capture_layer >= 0 ? &capture : nullptr)[0];
  if (state.capture_layer >= 0) {
    state.embeds.push_back(embeds);
    state.hidden.push_back(capture.hidden[0]);
  }
  prompt.done += n;
  return logits(all_logits ? hidden : hidden.narrow(0, n - 1, 1));
}

at::Tensor Thinker::decode_impl(const std::vector<int64_t>& tokens,
                                const std::vector<ThinkerState*>& states) {
  OMNI_CHECK(!tokens.empty() && tokens.size() == states.size(),
             "a decode step needs one state per token, got ", tokens.size(), " tokens and ",
             states.size(), " states");
  const auto b = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> positions;
  KvBatch caches;
  int64_t capture_layer = -1;
  for (int64_t i = 0; i < b; ++i) {
    ThinkerState& state = *states[i];
    OMNI_CHECK(state.cache.length() > 0, "decode needs a prefilled ThinkerState");
    OMNI_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.text.vocab_size, "token ", tokens[i],
               " is outside the vocabulary [0, ", cfg_.text.vocab_size, ")");
    if (state.capture_layer >= 0) {
      OMNI_CHECK(capture_layer < 0 || capture_layer == state.capture_layer,
                 "a decode batch captures one hidden layer, asked for ", capture_layer, " and ",
                 state.capture_layer);
      capture_layer = state.capture_layer;
    }
    positions.push_back(state.cache.length() + state.rope_delta);
    caches.push_back(&state.cache);
  }
  const auto opts = at::TensorOptions(at::kLong).device(device_);
  const auto ids = at::tensor(tokens, at::kLong).to(device_);
  // Text positions: the same on the temporal, height and width axes.
  const auto position_ids = at::tensor(positions, at::kLong).to(opts).unsqueeze(0).expand({3, b});
  const auto embeds = model_->embed(ids);  // [B, hidden]
  HiddenCapture capture{capture_layer, {}};
  auto hidden = model_->forward_batch(embeds.unsqueeze(1), position_ids, caches,
                                      capture_layer >= 0 ? &capture : nullptr);  // [B, 1, hidden]
  for (int64_t i = 0; i < b; ++i) {
    ThinkerState& state = *states[i];
    if (state.capture_layer < 0) continue;
    state.embeds.push_back(embeds.narrow(0, i, 1));
    state.hidden.push_back(capture.hidden[i]);
  }
  return logits(hidden.squeeze(1));
}

}  // namespace omni::models::qwen3_omni
