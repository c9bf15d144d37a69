#include "model_runner/qwen3_omni/text_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention_ops.h"
#include "cpu_offload/check.h"
#include "decode_attention.h"
#include "model_runner/qwen3_omni/moe_routing.h"

namespace omni::models::qwen3_omni {

using offload::HookArgs;

models::KvPoolShape kv_pool_shape(const TextConfig& cfg, at::ScalarType dtype, c10::Device device,
                                  int64_t block_size, int64_t num_blocks) {
  models::KvPoolShape shape;
  shape.num_layers = cfg.num_hidden_layers;
  shape.kv_heads = cfg.num_key_value_heads;
  shape.head_dim = cfg.head_dim;
  shape.block_size = block_size;
  shape.num_blocks = num_blocks;
  shape.dtype = dtype;
  shape.device = device;
  return shape;
}

// ---------------------------------------------------------------------------- rotary

std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const TextConfig& cfg,
                                                const at::Tensor& position_ids,
                                                at::ScalarType dtype) {
  const int64_t dim = cfg.head_dim;
  auto opts = at::TensorOptions(at::kFloat).device(position_ids.device());
  // inv_freq exactly as the reference: float32 arange / dim, then base ** (.) in float32.
  auto exponents =
      at::arange(0, dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) / static_cast<double>(dim);
  auto inv_freq = (1.0 / at::pow(cfg.rope_theta, exponents)).to(opts);
  auto freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [3, L, dim/2]
  auto recompose = [&](const at::Tensor& f) {
    auto out = f[0].clone();
    for (int64_t axis = 1; axis <= 2; ++axis) {
      // A slice in the reference: the end may lie past the last frequency.
      const int64_t end = std::min(cfg.mrope_section[axis] * 3, f.size(-1));
      auto idx = at::arange(axis, end, 3, at::TensorOptions(at::kLong).device(f.device()));
      out.index_copy_(-1, idx, f[axis].index_select(-1, idx));
    }
    return at::cat({out, out}, -1);
  };
  return {recompose(freqs.cos()).to(dtype), recompose(freqs.sin()).to(dtype)};
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(double theta, int64_t head_dim,
                                               const at::Tensor& positions, at::ScalarType dtype) {
  auto opts = at::TensorOptions(at::kFloat).device(positions.device());
  // As the reference: inv_freq = 1 / theta ** (arange(0, dim, 2) / dim) in float32.
  auto exponents = at::arange(0, head_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) /
                   static_cast<double>(head_dim);
  auto inv_freq = (1.0 / at::pow(theta, exponents)).to(opts);
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [L, dim/2]
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

// ---------------------------------------------------------------------------- attention

TextAttention::TextAttention(const TextConfig& cfg, at::ScalarType dtype, bool qk_norm)
    : torch::nn::Module("TextAttention"),
      heads_(cfg.num_attention_heads),
      kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim),
      scaling_f32_(
          at::scalar_tensor(1.0 / std::sqrt(static_cast<double>(cfg.head_dim)), at::kFloat)),
      scaling_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg.head_dim)))) {
  const int64_t h = cfg.hidden_size;
  q_proj_ = register_module(
      "q_proj", std::make_shared<Linear>(h, heads_ * head_dim_, dtype, cfg.attention_bias));
  k_proj_ = register_module(
      "k_proj", std::make_shared<Linear>(h, kv_heads_ * head_dim_, dtype, cfg.attention_bias));
  v_proj_ = register_module(
      "v_proj", std::make_shared<Linear>(h, kv_heads_ * head_dim_, dtype, cfg.attention_bias));
  o_proj_ = register_module(
      "o_proj", std::make_shared<Linear>(heads_ * head_dim_, h, dtype, cfg.attention_bias));
  if (qk_norm) {
    q_norm_ =
        register_module("q_norm", std::make_shared<RMSNorm>(head_dim_, dtype, cfg.rms_norm_eps));
    k_norm_ =
        register_module("k_norm", std::make_shared<RMSNorm>(head_dim_, dtype, cfg.rms_norm_eps));
  }
}

at::Tensor TextAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  KvCache* cache, int64_t layer, const at::Tensor* blocked) {
  return forward(x, cos, sin, cache ? KvBatch{cache} : KvBatch{}, layer, blocked);
}

at::Tensor TextAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const KvBatch& caches, int64_t layer, const at::Tensor* blocked) {
  const int64_t b = x.size(0), l = x.size(1);
  OMNI_CHECK(caches.size() <= 1 || static_cast<int64_t>(caches.size()) == b, "a batch of ", b,
             " rows needs one KV cache for all (rows of one length) or one per row, got ",
             caches.size());
  // q/k norm per head, before rope.
  auto q = q_proj_->forward(x).view({b, l, heads_, head_dim_});
  auto k = k_proj_->forward(x).view({b, l, kv_heads_, head_dim_});
  if (q_norm_) {
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = v_proj_->forward(x).view({b, l, kv_heads_, head_dim_}).transpose(1, 2);
  // [L, d] applies to every row, [B, L, d] row by row; both broadcast over the heads.
  const auto c = cos.dim() == 2 ? cos.unsqueeze(0).unsqueeze(0) : cos.unsqueeze(1);
  const auto s = sin.dim() == 2 ? sin.unsqueeze(0).unsqueeze(0) : sin.unsqueeze(1);
  q = q * c + rotate_half(q) * s;
  k = k * c + rotate_half(k) * s;

  at::Tensor out;
  if (caches.size() <= 1) {
    KvCache* cache = caches.empty() ? nullptr : caches[0];
    const int64_t past = cache ? cache->length() : 0;
    out = attend(q, cache ? cache->append(layer, k, v) : std::vector<KeysValues>{{k, v}}, past,
                 blocked);
  } else {
    // Each row has a history of its own length: attention row by row, over the row's cache in
    // place (a padded batch would copy every history each step), as the row computes it alone.
    std::vector<int64_t> pasts;
    std::vector<std::vector<KeysValues>> rows_kv;
    std::vector<KeysValues> kv;  // each row's one run, where every row has one
    for (int64_t i = 0; i < b; ++i) {
      pasts.push_back(caches[i]->length());
      rows_kv.push_back(caches[i]->append(layer, k.narrow(0, i, 1), v.narrow(0, i, 1)));
      if (rows_kv.back().size() == 1) kv.push_back(rows_kv.back()[0]);
    }
    if (!blocked && static_cast<int64_t>(kv.size()) == b && decode_attention_applies(q, kv)) {
      out = decode_attention(q, kv, scaling_);  // every row in one call, as each would alone
    } else {
      std::vector<at::Tensor> rows;
      rows.reserve(caches.size());
      for (int64_t i = 0; i < b; ++i) {
        rows.push_back(attend(q.narrow(0, i, 1), rows_kv[static_cast<size_t>(i)],
                              pasts[static_cast<size_t>(i)], blocked));
      }
      out = at::cat(rows, 0);
    }
  }
  return o_proj_->forward(out);
}

at::Tensor TextAttention::attend(const at::Tensor& q, const std::vector<KeysValues>& runs,
                                 int64_t past, const at::Tensor* blocked) {
  const int64_t b = q.size(0), l = q.size(2);
  // A decode step on the CPU, where the ops' fixed costs dominate: one pass (decode_attention.h).
  if (runs.size() == 1 && l == 1 && !blocked && decode_attention_applies(q, runs)) {
    return decode_attention(q, runs, scaling_);
  }
  const int64_t n_rep = heads_ / kv_heads_;
  // A decode step (one query, no mask): the n_rep query heads of a KV head are the rows of one
  // product with its history, read in place rather than repeated n_rep times.
  const bool grouped = l == 1 && n_rep > 1 && !blocked;
  // [b, kv_heads, n_rep, past + 1] grouped, else [b, heads, l, past + l]; a run's columns each.
  std::vector<at::Tensor> parts;
  const auto query = grouped ? q.reshape({b, kv_heads_, n_rep, head_dim_}) : q;
  for (const auto& run : runs) {
    const auto& keys = run.first;
    parts.push_back(at::matmul(query, (grouped ? keys : repeat_kv(keys, n_rep)).transpose(2, 3)));
  }
  at::Tensor scores = parts.size() == 1 ? parts[0] : at::cat(parts, -1);
  parts.clear();
  // The same product as `* scaling`: a double scalar is rounded to float32 for float32 scores.
  if (scores.scalar_type() == at::kFloat) {
    scores.mul_(scaling_f32_);
  } else {
    scores = scores * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  }
  if (blocked) {
    scores = scores.masked_fill(*blocked, -std::numeric_limits<float>::infinity());
  } else if (l > 1) {
    // Query i (absolute position past + i) sees keys 0 .. past + i.
    auto qpos = at::arange(past, past + l, at::TensorOptions(at::kLong).device(q.device()));
    auto kpos = at::arange(0, past + l, at::TensorOptions(at::kLong).device(q.device()));
    auto causal = kpos.unsqueeze(0) > qpos.unsqueeze(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
  }
  auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  // Each run's values weighted by its columns of the probabilities, summed over the runs: the
  // blocks are read where they lie, never gathered into one history.
  at::Tensor out;
  int64_t column = 0;
  for (const auto& run : runs) {
    const int64_t len = run.second.size(2);
    const auto weights = runs.size() == 1 ? probs : probs.narrow(-1, column, len);
    auto part = at::matmul(weights, grouped ? run.second : repeat_kv(run.second, n_rep));
    out = out.defined() ? out.add_(part) : part;
    column += len;
  }
  if (grouped) out = out.view({b, heads_, 1, head_dim_});
  return out.transpose(1, 2).reshape({b, l, heads_ * head_dim_});
}

// ---------------------------------------------------------------------------- MLPs

TextMlp::TextMlp(int64_t hidden, int64_t intermediate, at::ScalarType dtype)
    : torch::nn::Module("TextMlp") {
  gate_proj_ =
      register_module("gate_proj", std::make_shared<Linear>(hidden, intermediate, dtype, false));
  up_proj_ =
      register_module("up_proj", std::make_shared<Linear>(hidden, intermediate, dtype, false));
  down_proj_ =
      register_module("down_proj", std::make_shared<Linear>(intermediate, hidden, dtype, false));
}

at::Tensor TextMlp::forward(const at::Tensor& x) {
  return down_proj_->forward(at::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
}

SparseMoe::SparseMoe(const TextConfig& cfg, at::ScalarType dtype)
    : torch::nn::Module("SparseMoe"),
      top_k_(cfg.num_experts_per_tok),
      norm_topk_prob_(cfg.norm_topk_prob) {
  gate_ = register_module("gate",
                          std::make_shared<Linear>(cfg.hidden_size, cfg.num_experts, dtype, false));
  auto holder = register_module("experts", std::make_shared<torch::nn::Module>("Experts"));
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    experts_.push_back(holder->register_module(
        std::to_string(e),
        std::make_shared<TextMlp>(cfg.hidden_size, cfg.moe_intermediate_size, dtype)));
  }
  if (cfg.shared_expert_intermediate_size > 0) {
    shared_expert_ = register_module(
        "shared_expert",
        std::make_shared<TextMlp>(cfg.hidden_size, cfg.shared_expert_intermediate_size, dtype));
    shared_expert_gate_ = register_module(
        "shared_expert_gate", std::make_shared<Linear>(cfg.hidden_size, 1, dtype, false));
  }
}

at::Tensor SparseMoe::forward(const at::Tensor& x) {
  const auto shape = x.sizes().vec();
  auto flat = x.reshape({-1, shape.back()});
  // Router: softmax in float32 over all experts, top-k, renormalized when configured.
  auto router_logits = gate_->forward(flat);
  auto probs = at::softmax(router_logits, -1, at::kFloat);
  auto [top_values, top_index] = at::topk(probs, top_k_, -1);
  if (norm_topk_prob_) top_values = top_values / top_values.sum(-1, /*keepdim=*/true);
  top_values = top_values.to(router_logits.scalar_type());

  auto routing = route_tokens(top_index, top_values, static_cast<int64_t>(experts_.size()));
  ++(routing.plan == MoeRouting::Plan::kDecode ? counters_.decode_forwards
                                               : counters_.prefill_forwards);
  counters_.host_copies += routing.host_copies;

  // Prefill and decode alike run the hit experts one by one over their contiguous ranges of
  // the sorted rows. A grouped GEMM (at::_grouped_mm, which torch 2.11 has on the CPU for fp32
  // and bf16, and on CUDA for bf16 from sm90) or a gather + bmm takes the experts' weights as one
  // stacked [experts, ...] tensor; here each expert is a module of its own whose parameters the
  // offload engine rebinds separately, so stacking would copy every hit expert's weights on
  // every call: as many bytes as the multiplies themselves read.
  at::Tensor out;
  if (routing.experts.empty()) {
    out = at::zeros_like(flat);  // no tokens
  } else {
    std::vector<at::Tensor> outputs;
    {
      const auto rows = flat.index_select(0, routing.tokens);
      // Where experts may run on the host, the rows go there now, before prepare() makes
      // compute wait for this layer's missing experts: the copy waits only for the rows (the
      // routing's host copy has just waited for the router), and the host experts need not
      // wait for any expert's copy. On the simulated device this is the same tensor.
      at::Tensor host_rows;
      if (provider_ && provider_->may_run_on_host()) host_rows = rows.to(at::kCPU);
      // With expert offload, the provider makes each chunk of at most capacity() experts
      // usable before it runs: one chunk (one call per layer) unless the cache is smaller than
      // the hit experts.
      const size_t n = routing.experts.size();
      const size_t chunk = provider_ ? std::max<size_t>(1, provider_->capacity()) : n;
      outputs.resize(n);
      // The next layer's prediction (when the hit experts fit one prepare): taken before
      // prepare() makes compute wait for this layer's missing experts, so that its host copy
      // waits only for the next router's product; handed over after prepare(), so that its
      // copies overlap these experts' compute and never evict them.
      const bool predict =
          provider_ && next_router_ && n <= chunk && provider_->wants_prediction(layer_);
      const std::vector<int64_t> predicted = predict ? predict_next(flat) : std::vector<int64_t>{};
      for (size_t first = 0; first < n; first += chunk) {
        const size_t last = std::min(n, first + chunk);
        std::vector<bool> on_host(last - first, false);
        if (provider_) {
          std::vector<int64_t> ids, counts;
          for (size_t i = first; i < last; ++i) {
            ids.push_back(routing.experts[i].expert);
            counts.push_back(routing.experts[i].end - routing.experts[i].begin);
          }
          on_host = provider_->prepare(layer_, ids, counts);
          if (predict) provider_->prefetch(next_layer_, predicted);
        }
        run_experts(rows, host_rows, routing, first, on_host, outputs);
      }
    }
    auto sorted_outputs = at::cat(outputs);
    outputs.clear();
    out = combine_expert_outputs(std::move(sorted_outputs), routing);
  }
  if (shared_expert_) {
    out = out + at::sigmoid(shared_expert_gate_->forward(flat)) * shared_expert_->forward(flat);
  }
  return out.view(shape);
}

at::Tensor SparseMoe::run_expert(int64_t expert, const at::Tensor& rows) {
  ++counters_.expert_calls;
  return experts_[expert]->forward(rows);
}

void SparseMoe::set_expert_provider(ExpertProvider* provider, int64_t layer,
                                    std::shared_ptr<Linear> next_router, int64_t next_layer) {
  provider_ = provider;
  layer_ = layer;
  next_router_ = std::move(next_router);
  next_layer_ = next_layer;
}

void SparseMoe::run_experts(const at::Tensor& rows, at::Tensor& host_rows,
                            const MoeRouting& routing, size_t first,
                            const std::vector<bool>& on_host, std::vector<at::Tensor>& outputs) {
  const size_t last = first + on_host.size();
  std::vector<size_t> host;
  for (size_t i = first; i < last; ++i) {
    if (on_host[i - first]) host.push_back(i);
  }
  // The device experts first: queued, they run while the host computes the others.
  for (size_t i = first; i < last; ++i) {
    if (on_host[i - first]) continue;
    const auto& e = routing.experts[i];
    outputs[i] = run_expert(e.expert, rows.slice(0, e.begin, e.end));
  }
  if (host.empty()) return;
  // Host-placed experts, computed where their weights lie (as llama.cpp's --cpu-moe does),
  // from the rows the forward copied to the host before prepare() (a provider that said it
  // would place none on the host gets them copied now).
  if (!host_rows.defined()) host_rows = rows.to(at::kCPU);
  for (size_t i : host) {
    const auto& e = routing.experts[i];
    // Timed alone: the auto miss policy compares the host's rate with the link's.
    const auto start = std::chrono::steady_clock::now();
    outputs[i] = run_expert(e.expert, host_rows.slice(0, e.begin, e.end));
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    provider_->host_computed(layer_, e.expert, e.end - e.begin, took.count());
  }
  // Their outputs go back in one copy (the simulated device takes this path too, its copy a
  // no-op, so that the tests run it).
  std::vector<at::Tensor> host_outputs;
  for (size_t i : host) host_outputs.push_back(outputs[i]);
  const auto back = at::cat(host_outputs).to(rows.device());
  int64_t at = 0;
  for (size_t i : host) {
    const int64_t count = routing.experts[i].end - routing.experts[i].begin;
    outputs[i] = back.slice(0, at, at + count);
    at += count;
  }
}

std::vector<int64_t> SparseMoe::predict_next(const at::Tensor& flat) {
  // The next router's top-k on this layer's MoE input (softmax keeps the order: no need for
  // it). One small host copy of the ids, counted on the host: at::bincount on CUDA would read
  // their minimum and maximum on the host first, two more waits for the device.
  const auto logits = next_router_->forward(flat);
  const auto top =
      std::get<1>(at::topk(logits, top_k_, -1)).reshape({-1}).to(at::kCPU).contiguous();
  std::vector<int64_t> count(static_cast<size_t>(logits.size(-1)), 0);
  const auto* t = top.data_ptr<int64_t>();
  for (int64_t i = 0; i < top.numel(); ++i) ++count[static_cast<size_t>(t[i])];
  std::vector<int64_t> experts;
  for (size_t e = 0; e < count.size(); ++e) {
    if (count[e] > 0) experts.push_back(static_cast<int64_t>(e));
  }
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int64_t a, int64_t b) { return count[a] > count[b]; });
  return experts;
}

MoeStats SparseMoe::stats() const {
  MoeStats s;
  s.decode_forwards = counters_.decode_forwards.load();
  s.prefill_forwards = counters_.prefill_forwards.load();
  s.host_copies = counters_.host_copies.load();
  s.expert_calls = counters_.expert_calls.load();
  return s;
}

// ---------------------------------------------------------------------------- layers

DecoderLayer::DecoderLayer(const TextConfig& cfg, int64_t index, at::ScalarType dtype)
    : offload::HookableModule("DecoderLayer"), index_(index) {
  self_attn_ = register_module("self_attn", std::make_shared<TextAttention>(cfg, dtype));
  if (cfg.is_sparse_layer(index)) {
    moe_ = register_module("mlp", std::make_shared<SparseMoe>(cfg, dtype));
  } else {
    dense_ = register_module(
        "mlp", std::make_shared<TextMlp>(cfg.hidden_size, cfg.intermediate_size, dtype));
  }
  input_layernorm_ = register_module(
      "input_layernorm", std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm",
                      std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                 const at::Tensor& sin, KvCache* cache) {
  return forward(hidden, cos, sin, cache ? KvBatch{cache} : KvBatch{});
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                 const at::Tensor& sin, const KvBatch& caches) {
  return invoke("forward", {hidden},
                [&](HookArgs& a) -> c10::IValue {
                  const auto& h = a[0].toTensor();
                  auto x = h + self_attn_->forward(input_layernorm_->forward(h), cos, sin, caches,
                                                   index_);
                  auto normed = post_attention_layernorm_->forward(x);
                  return x + (moe_ ? moe_->forward(normed) : dense_->forward(normed));
                })
      .toTensor();
}

TextModel::TextModel(const TextConfig& cfg, at::ScalarType dtype, const std::string& embedding_name)
    : offload::HookableModule("TextModel", {"forward", "embed", "logits"}), cfg_(cfg) {
  embed_tokens_ = register_module(
      embedding_name, std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, dtype));
  layers_holder_ = register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers_.push_back(layers_holder_->register_module(
        std::to_string(i), std::make_shared<DecoderLayer>(cfg, i, dtype)));
  }
  norm_ =
      register_module("norm", std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
}

void TextModel::set_expert_provider(ExpertProvider* provider) {
  std::vector<std::pair<int64_t, SparseMoe*>> moes;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (auto* moe = layers_[i]->moe()) moes.emplace_back(static_cast<int64_t>(i), moe);
  }
  for (size_t k = 0; k < moes.size(); ++k) {
    const bool has_next = k + 1 < moes.size();
    moes[k].second->set_expert_provider(provider, moes[k].first,
                                        has_next ? moes[k + 1].second->router() : nullptr,
                                        has_next ? moes[k + 1].first : -1);
  }
}

at::Tensor TextModel::embed(const at::Tensor& ids) {
  return invoke(
             "embed", {ids},
             [this](HookArgs& a) -> c10::IValue { return embed_tokens_->forward(a[0].toTensor()); })
      .toTensor();
}

at::Tensor TextModel::tied_logits(const at::Tensor& hidden) {
  return invoke("logits", {hidden},
                [this](HookArgs& a) -> c10::IValue {
                  return at::linear(a[0].toTensor(), embed_tokens_->weight);
                })
      .toTensor();
}

at::Tensor TextModel::forward(const at::Tensor& embeds, const at::Tensor& position_ids,
                              KvCache* cache, const DeepStackInput* deepstack,
                              HiddenCapture* capture) {
  return invoke("forward", {embeds, position_ids},
                [&](HookArgs& a) -> c10::IValue {
                  const auto& input = a[0].toTensor();
                  auto [cos, sin] = mrope_cos_sin(cfg_, a[1].toTensor(), input.scalar_type());
                  return run_layers(input, cos, sin, cache ? KvBatch{cache} : KvBatch{}, deepstack,
                                    capture);
                })
      .toTensor();
}

at::Tensor TextModel::forward_batch(const at::Tensor& embeds, const at::Tensor& position_ids,
                                    const KvBatch& caches, HiddenCapture* capture) {
  OMNI_CHECK(embeds.dim() == 3 && embeds.size(1) == 1 && position_ids.size(1) == embeds.size(0),
             "a batch decode step takes embeds [B, 1, hidden] and positions [3, B], got ",
             embeds.sizes(), " and ", position_ids.sizes());
  return invoke("forward", {embeds, position_ids},
                [&](HookArgs& a) -> c10::IValue {
                  const auto& input = a[0].toTensor();
                  // Row b's one position: cos / sin [B, d] -> [B, 1, d].
                  auto [cos, sin] = mrope_cos_sin(cfg_, a[1].toTensor(), input.scalar_type());
                  return run_layers(input, cos.unsqueeze(1), sin.unsqueeze(1), caches, nullptr,
                                    capture);
                })
      .toTensor();
}

at::Tensor TextModel::run_layers(const at::Tensor& input, const at::Tensor& cos,
                                 const at::Tensor& sin, const KvBatch& caches,
                                 const DeepStackInput* deepstack, HiddenCapture* capture) {
  const int64_t want = capture ? capture->layer : -1;
  if (want == 0) capture->hidden = input;
  at::Tensor hidden = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    hidden = layers_[i]->forward(hidden, cos, sin, caches);
    if (want == static_cast<int64_t>(i) + 1 && want < cfg_.num_hidden_layers) {
      capture->hidden = hidden;
    }
    if (deepstack && i < deepstack->features.size()) {
      hidden = hidden.clone();
      auto rows = hidden[0];
      auto idx = at::nonzero(deepstack->visual_mask).squeeze(1);
      rows.index_copy_(0, idx,
                       rows.index_select(0, idx) + deepstack->features[i].to(hidden.scalar_type()));
    }
  }
  auto out = norm_->forward(hidden);
  // HF replaces the last recorded hidden state by the normalized output.
  if (want == cfg_.num_hidden_layers) capture->hidden = out;
  return out;
}

}  // namespace omni::models::qwen3_omni
