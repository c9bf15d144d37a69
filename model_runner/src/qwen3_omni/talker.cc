#include "model_runner/qwen3_omni/talker.h"

#include <ATen/ATen.h>

#include <chrono>
#include <sstream>

#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/rope_index.h"

namespace omni::models::qwen3_omni {

using offload::HookArgs;

// ---------------------------------------------------------------------------- projections

ResizeMlp::ResizeMlp(int64_t in, int64_t intermediate, int64_t out, at::ScalarType dtype)
    : offload::HookableModule("ResizeMlp") {
  linear_fc1_ =
      register_module("linear_fc1", std::make_shared<Linear>(in, intermediate, dtype, true));
  linear_fc2_ =
      register_module("linear_fc2", std::make_shared<Linear>(intermediate, out, dtype, true));
}

at::Tensor ResizeMlp::forward(const at::Tensor& x) {
  return invoke("forward", {x},
                [this](HookArgs& a) -> c10::IValue {
                  return linear_fc2_->forward(at::silu(linear_fc1_->forward(a[0].toTensor())));
                })
      .toTensor();
}

// ---------------------------------------------------------------------------- code predictor

namespace {

// The code predictor's layers are the thinker's dense decoder layers with its sizes.
TextConfig code_predictor_layer_config(const CodePredictorConfig& c) {
  TextConfig t;
  t.vocab_size = c.vocab_size;
  t.hidden_size = c.hidden_size;
  t.intermediate_size = c.intermediate_size;
  t.num_hidden_layers = c.num_hidden_layers;
  t.num_attention_heads = c.num_attention_heads;
  t.num_key_value_heads = c.num_key_value_heads;
  t.head_dim = c.head_dim;
  t.rms_norm_eps = c.rms_norm_eps;
  t.attention_bias = c.attention_bias;
  t.num_experts = 0;  // dense MLPs
  return t;
}

}  // namespace

CodePredictorModel::CodePredictorModel(const CodePredictorConfig& cfg, at::ScalarType dtype)
    : torch::nn::Module("CodePredictorModel"), cfg_(cfg) {
  const TextConfig layer_cfg = code_predictor_layer_config(cfg);
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers_.push_back(layers->register_module(std::to_string(i),
                                              std::make_shared<DecoderLayer>(layer_cfg, i, dtype)));
  }
  norm_ =
      register_module("norm", std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
  auto tables = register_module("codec_embedding", std::make_shared<torch::nn::Module>("Tables"));
  for (int64_t k = 0; k + 1 < cfg.num_code_groups; ++k) {
    codec_embedding_.push_back(tables->register_module(
        std::to_string(k), std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, dtype)));
  }
}

at::Tensor CodePredictorModel::forward(const at::Tensor& embeds, KvCache* cache) {
  return forward(embeds, rope_table(cache->length() + embeds.size(1), embeds.options()), cache);
}

std::pair<at::Tensor, at::Tensor> CodePredictorModel::rope_table(
    int64_t n, const at::TensorOptions& like) const {
  const auto positions = at::arange(0, n, at::TensorOptions(at::kLong).device(like.device()));
  return rope_cos_sin(cfg_.rope_theta, cfg_.head_dim, positions, like.dtype().toScalarType());
}

at::Tensor CodePredictorModel::forward(const at::Tensor& embeds,
                                       const std::pair<at::Tensor, at::Tensor>& table,
                                       KvCache* cache) {
  const int64_t past = cache->length(), l = embeds.size(1);
  OMNI_CHECK(table.first.size(0) >= past + l, "CodePredictorModel: the rotary table has ",
             table.first.size(0), " positions, ", past + l, " needed");
  const auto cos = table.first.narrow(0, past, l);
  const auto sin = table.second.narrow(0, past, l);
  at::Tensor hidden = embeds;
  for (auto& layer : layers_) hidden = layer->forward(hidden, cos, sin, cache);
  return norm_->forward(hidden);
}

at::Tensor CodePredictorModel::embed(int64_t table, const at::Tensor& ids) {
  return codec_embedding_.at(static_cast<size_t>(table))->forward(ids);
}

CodePredictor::CodePredictor(const CodePredictorConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("CodePredictor"), cfg_(cfg) {
  model_ = register_module("model", std::make_shared<CodePredictorModel>(cfg, dtype));
  auto heads = register_module("lm_head", std::make_shared<torch::nn::Module>("Heads"));
  for (int64_t k = 0; k + 1 < cfg.num_code_groups; ++k) {
    lm_head_.push_back(heads->register_module(
        std::to_string(k),
        std::make_shared<Linear>(cfg.hidden_size, cfg.vocab_size, dtype, false)));
  }
}

CodePredictor::Frame CodePredictor::predict(const at::Tensor& talker_hidden,
                                            const at::Tensor& code0_embed, Sampler& sampler,
                                            std::vector<at::Tensor>* logits) {
  const int64_t hidden = cfg_.hidden_size;
  auto batch = predict_batch(talker_hidden.reshape({1, hidden}), code0_embed.reshape({1, hidden}),
                             {&sampler}, logits);
  return {std::move(batch.codes[0]), batch.embeds[0]};
}

CodePredictor::FrameBatch CodePredictor::predict_batch(const at::Tensor& talker_hidden,
                                                       const at::Tensor& code0_embed,
                                                       const std::vector<Sampler*>& samplers,
                                                       std::vector<at::Tensor>* logits) {
  const auto b = static_cast<int64_t>(samplers.size());
  OMNI_CHECK(talker_hidden.dim() == 2 && talker_hidden.size(0) == b &&
                 code0_embed.sizes() == talker_hidden.sizes(),
             "CodePredictor::predict_batch: hidden and code 0 embeddings must be [", b,
             ", hidden], got ", talker_hidden.sizes(), " and ", code0_embed.sizes());
  FrameBatch frames;
  frames.codes.resize(static_cast<size_t>(b));
  invoke("forward", {talker_hidden, code0_embed}, [&](HookArgs& a) -> c10::IValue {
    const auto& h = a[0].toTensor();
    const auto& e0 = a[1].toTensor();
    // Fresh per frame, as each generate call starts one; the rows have one length, so one
    // cache holds them all.
    KvCache cache(cfg_.num_hidden_layers);
    // Step 0 reads [talker hidden, code 0 embedding] with head 0; step k embeds code k with
    // table k - 1 and reads head k.
    at::Tensor input = at::stack({h, e0}, 1);  // [B, 2, hidden]
    std::vector<at::Tensor> embeds;
    const auto ids_opts = at::TensorOptions(at::kLong).device(h.device());
    // Positions 0 .. groups: the two inputs of step 0, then one per later step.
    const auto rope = model_->rope_table(cfg_.num_code_groups, input.options());
    // The frame's random numbers, each row's in one call: the same draws as group by group.
    const auto noise = Sampler::draw_noise(samplers, cfg_.num_code_groups - 1, cfg_.vocab_size);
    for (int64_t k = 0; k + 1 < cfg_.num_code_groups; ++k) {
      const auto out = model_->forward(input, rope, &cache);
      const auto last = out.select(1, out.size(1) - 1);  // [B, hidden]
      // One row alone keeps its [hidden] product: the reference's numbers.
      const auto step_logits =
          (b == 1 ? lm_head_[k]->forward(last[0]).unsqueeze(0) : lm_head_[k]->forward(last))
              .to(at::kFloat)
              .cpu();
      if (logits) logits->push_back(b == 1 ? step_logits[0] : step_logits);
      const auto codes = Sampler::sample_rows(samplers, step_logits, {}, noise.select(1, k));
      for (int64_t i = 0; i < b; ++i) frames.codes[i].push_back(codes[i]);
      const auto embed = model_->embed(k, at::tensor(codes, at::kLong).to(ids_opts));  // [B, h]
      embeds.push_back(embed);
      input = embed.unsqueeze(1);
    }
    frames.embeds = at::stack(embeds, 1);
    return c10::IValue();
  });
  return frames;
}

// ---------------------------------------------------------------------------- talker

Talker::Talker(const TalkerConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("Talker", {"prefill", "step"}), cfg_(cfg), dtype_(dtype) {
  const int64_t hidden = cfg.text.hidden_size;
  // Both projections are ResizeMlp(thinker hidden -> text intermediate -> talker hidden).
  model_ =
      register_module("model", std::make_shared<TextModel>(cfg.text, dtype, "codec_embedding"));
  text_projection_ = register_module(
      "text_projection", std::make_shared<ResizeMlp>(cfg.thinker_hidden_size,
                                                     cfg.text.intermediate_size, hidden, dtype));
  hidden_projection_ = register_module(
      "hidden_projection", std::make_shared<ResizeMlp>(cfg.thinker_hidden_size,
                                                       cfg.text.intermediate_size, hidden, dtype));
  codec_head_ = register_module(
      "codec_head", std::make_shared<HookableLinear>(hidden, cfg.text.vocab_size, dtype, false));
  code_predictor_ =
      register_module("code_predictor", std::make_shared<CodePredictor>(cfg.code_predictor, dtype));
}

at::Tensor Talker::logits(const at::Tensor& hidden) {
  return codec_head_->forward(hidden).to(at::kFloat).cpu();
}

void Talker::check_prompt(const TalkerPrompt& prompt) const {
  const int64_t n = prompt.rows.defined() ? prompt.rows.size(0) : 0;
  OMNI_CHECK(n > 0 && static_cast<int64_t>(prompt.multimodal.size()) == n &&
                 static_cast<int64_t>(prompt.codec_ids.size()) == n &&
                 static_cast<int64_t>(prompt.input_ids.size()) == n,
             "Talker: the prompt's rows, multimodal flags, codec ids and input ids must have one "
             "entry per position");
  OMNI_CHECK(
      prompt.rows.dim() == 2 && prompt.rows.size(1) == cfg_.thinker_hidden_size &&
          (!prompt.trailing.defined() ||
           (prompt.trailing.dim() == 2 && prompt.trailing.size(1) == cfg_.thinker_hidden_size)) &&
          prompt.tts_pad.defined() && prompt.tts_pad.numel() == cfg_.thinker_hidden_size,
      "Talker: the prompt's rows, trailing rows and tts_pad must have ", cfg_.thinker_hidden_size,
      " columns (thinker_hidden_size)");
  for (int64_t id : prompt.codec_ids) {
    OMNI_CHECK(id >= -1 && id < cfg_.text.vocab_size, "Talker: codec id ", id, " outside [0, ",
               cfg_.text.vocab_size, ")");
  }
}

Talker::ProjectedPrompt Talker::project(const TalkerPrompt& prompt) {
  check_prompt(prompt);
  ProjectedPrompt out;
  invoke("prefill", {}, [&](HookArgs&) -> c10::IValue {
    out = project_impl(prompt);
    return c10::IValue();
  });
  return out;
}

Talker::ProjectedPrompt Talker::project_impl(const TalkerPrompt& prompt) {
  const int64_t n = prompt.rows.size(0);
  const auto rows = prompt.rows.to(device_, dtype_);
  std::vector<int64_t> text_idx, mm_idx, codec_pos, codec_ids;
  for (int64_t p = 0; p < n; ++p) {
    (prompt.multimodal[p] ? mm_idx : text_idx).push_back(p);
    if (prompt.codec_ids[p] >= 0) {
      codec_pos.push_back(p);
      codec_ids.push_back(prompt.codec_ids[p]);
    }
  }
  ProjectedPrompt out;
  out.embeds = at::empty({n, cfg_.text.hidden_size}, rows.options());
  const auto project_rows = [&](const std::vector<int64_t>& idx, ResizeMlp& mlp) {
    if (idx.empty()) return;
    const auto where = at::tensor(idx, at::kLong).to(device_);
    out.embeds.index_copy_(0, where, mlp.forward(rows.index_select(0, where)));
  };
  project_rows(text_idx, *text_projection_);
  project_rows(mm_idx, *hidden_projection_);
  if (!codec_pos.empty()) {
    const auto where = at::tensor(codec_pos, at::kLong).to(device_);
    const auto codec = model_->embed(at::tensor(codec_ids, at::kLong).to(device_));
    out.embeds.index_copy_(0, where, out.embeds.index_select(0, where) + codec);
  }
  out.trailing = project_text_rows(
      prompt.trailing.defined() ? prompt.trailing : at::empty({0, cfg_.thinker_hidden_size}));
  out.tts_pad = text_projection_->forward(prompt.tts_pad.reshape({1, -1}).to(device_, dtype_))[0];
  return out;
}

at::Tensor Talker::prefill(const TalkerPrompt& prompt,
                           const std::vector<std::array<int64_t, 3>>& image_grids,
                           TalkerState& state) {
  check_prompt(prompt);
  OMNI_CHECK(state.cache.length() == 0, "Talker::prefill needs a fresh TalkerState");
  // One hooked call for projection and prefill: an offloaded talker comes on once.
  return invoke("prefill", {},
                [&](HookArgs&) -> c10::IValue {
                  return prefill_impl(project_impl(prompt), prompt.input_ids, image_grids, state);
                })
      .toTensor();
}

at::Tensor Talker::prefill_embeds(const ProjectedPrompt& prompt,
                                  const std::vector<int64_t>& input_ids,
                                  const std::vector<std::array<int64_t, 3>>& image_grids,
                                  TalkerState& state) {
  OMNI_CHECK(state.cache.length() == 0, "Talker::prefill needs a fresh TalkerState");
  const int64_t n = prompt.embeds.defined() ? prompt.embeds.size(0) : 0;
  OMNI_CHECK(n > 0 && static_cast<int64_t>(input_ids.size()) == n &&
                 prompt.embeds.size(1) == cfg_.text.hidden_size,
             "Talker::prefill: embeds must be [", input_ids.size(), ", ", cfg_.text.hidden_size,
             "], got ", prompt.embeds.sizes());
  return invoke("prefill", {},
                [&](HookArgs&) -> c10::IValue {
                  return prefill_impl(prompt, input_ids, image_grids, state);
                })
      .toTensor();
}

at::Tensor Talker::prefill_impl(const ProjectedPrompt& prompt,
                                const std::vector<int64_t>& input_ids,
                                const std::vector<std::array<int64_t, 3>>& image_grids,
                                TalkerState& state) {
  state.trailing.clear();
  if (prompt.trailing.defined()) {
    for (int64_t i = 0; i < prompt.trailing.size(0); ++i) {
      state.trailing.push_back(prompt.trailing[i].to(device_, dtype_));
    }
  }
  state.tts_pad = prompt.tts_pad.to(device_, dtype_).reshape({-1});
  const auto rope = rope_positions(cfg_.rope, input_ids, image_grids);
  state.rope_delta = rope.rope_delta;
  const auto hidden = model_->forward(prompt.embeds.to(device_, dtype_).unsqueeze(0),
                                      rope.position_ids.to(device_), &state.cache)[0];
  state.last_hidden = hidden[hidden.size(0) - 1];
  return logits(state.last_hidden);
}

at::Tensor Talker::project_text_rows(const at::Tensor& rows) {
  // One row at a time: the projection of a row must not depend on how many rows came with it
  // (a matrix product over k rows may round differently from k products over one row), so that
  // a hand-off streamed in pieces gives the talker exactly the rows a whole one gives.
  std::vector<at::Tensor> out;
  const auto on_device = rows.to(device_, dtype_);
  for (int64_t i = 0; i < on_device.size(0); ++i) {
    out.push_back(text_projection_->forward(on_device.narrow(0, i, 1)));
  }
  if (out.empty()) return at::empty({0, cfg_.text.hidden_size}, on_device.options());
  return at::cat(out, 0);
}

void Talker::add_trailing(const at::Tensor& rows, bool complete, TalkerState& state) {
  OMNI_CHECK(rows.dim() == 2 && rows.size(1) == cfg_.thinker_hidden_size,
             "Talker::add_trailing: rows must be [k, ", cfg_.thinker_hidden_size, "], got ",
             rows.sizes());
  if (rows.size(0) > 0) {
    invoke("prefill", {}, [&](HookArgs&) -> c10::IValue {
      const auto projected = project_text_rows(rows);
      for (int64_t i = 0; i < projected.size(0); ++i) state.trailing.push_back(projected[i]);
      return c10::IValue();
    });
  }
  state.trailing_complete = complete;
}

std::vector<int64_t> Talker::step(int64_t code0, TalkerState& state,
                                  Sampler& code_predictor_sampler, at::Tensor& next_logits,
                                  std::vector<at::Tensor>* code_predictor_logits) {
  at::Tensor logits_batch;
  auto frames =
      step_batch({code0}, {&state}, {&code_predictor_sampler}, logits_batch, code_predictor_logits);
  next_logits = logits_batch[0];
  return std::move(frames[0]);
}

std::vector<std::vector<int64_t>> Talker::step_batch(
    const std::vector<int64_t>& codes0, const std::vector<TalkerState*>& states,
    const std::vector<Sampler*>& samplers, at::Tensor& next_logits,
    std::vector<at::Tensor>* code_predictor_logits) {
  const auto b = static_cast<int64_t>(codes0.size());
  OMNI_CHECK(b > 0 && states.size() == codes0.size() && samplers.size() == codes0.size(),
             "Talker::step_batch needs one state and one sampler per code, got ", codes0.size(),
             " codes, ", states.size(), " states and ", samplers.size(), " samplers");
  for (int64_t i = 0; i < b; ++i) {
    OMNI_CHECK(states[i]->cache.length() > 0, "Talker::step needs a prefilled TalkerState");
    OMNI_CHECK(codes0[i] >= 0 && codes0[i] < cfg_.text.vocab_size, "Talker::step: code ", codes0[i],
               " outside [0, ", cfg_.text.vocab_size, ")");
  }
  std::vector<std::vector<int64_t>> frames(static_cast<size_t>(b));
  next_logits =
      invoke("step", {}, [&](HookArgs&) -> c10::IValue {
        const auto ids = at::tensor(codes0, at::kLong).to(device_);
        const auto e0 = model_->embed(ids);  // [B, hidden]
        std::vector<at::Tensor> last;
        for (auto* state : states) last.push_back(state->last_hidden);
        const auto cp_start = std::chrono::steady_clock::now();
        auto predicted =
            code_predictor_->predict_batch(at::stack(last), e0, samplers, code_predictor_logits);
        const double cp_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cp_start)
                .count();
        std::vector<at::Tensor> text_rows;
        std::vector<int64_t> positions;
        KvBatch caches;
        for (int64_t i = 0; i < b; ++i) {
          TalkerState& state = *states[i];
          state.code_predictor_ms += cp_ms;  // the batch's: each row waited for all of it
          frames[i] = {codes0[i]};
          const auto& codes = predicted.codes[i];
          frames[i].insert(frames[i].end(), codes.begin(), codes.end());
          const bool has_row = state.step < static_cast<int64_t>(state.trailing.size());
          OMNI_CHECK(has_row || state.trailing_complete, "Talker::step ", state.step,
                     " needs a text row the thinker has not sent yet");
          text_rows.push_back(has_row ? state.trailing[state.step] : state.tts_pad);
          ++state.step;
          positions.push_back(state.cache.length() + state.rope_delta);
          caches.push_back(&state.cache);
        }
        // The next inputs: the sum of each frame's codec embeddings (in the reference's order)
        // plus its step's text row, or tts_pad once the text is used up. Summed for the batch
        // at once: each row adds up in the same order as alone.
        const auto inputs =
            at::cat({e0.unsqueeze(1), predicted.embeds}, 1).sum(1) + at::stack(text_rows);
        const auto position_ids =
            at::tensor(positions, at::kLong).to(device_).unsqueeze(0).expand({3, b});
        const auto hidden = model_->forward_batch(inputs.unsqueeze(1), position_ids, caches);
        for (int64_t i = 0; i < b; ++i) states[i]->last_hidden = hidden[i][0];
        // One row alone keeps its [hidden] product: the reference's numbers.
        return b == 1 ? logits(states[0]->last_hidden).unsqueeze(0) : logits(hidden.select(1, 0));
      }).toTensor();
  return frames;
}

std::vector<int64_t> talker_suppressed_tokens(const TalkerConfig& cfg) {
  std::vector<int64_t> ids;
  for (int64_t id = std::max<int64_t>(cfg.text.vocab_size - 1024, 0); id < cfg.text.vocab_size;
       ++id) {
    if (id != cfg.codec_eos_token_id) ids.push_back(id);
  }
  return ids;
}

int64_t speaker_codec_id(const TalkerConfig& cfg, const std::string& name) {
  std::string lower = name;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::ostringstream known;
  for (size_t i = 0; i < cfg.speakers.size(); ++i) {
    if (cfg.speakers[i].first == lower) return cfg.speakers[i].second;
    known << (i ? ", " : "") << cfg.speakers[i].first;
  }
  OMNI_THROW("unknown speaker '", name, "'; this checkpoint has: ", known.str());
}

}  // namespace omni::models::qwen3_omni
