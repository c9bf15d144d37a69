// The Qwen3-Omni thinker's text decoder ("thinker.model.*" on disk): token embedding, decoder
// layers (RMSNorm, GQA attention with per-head q/k RMSNorm and interleaved multimodal rope, a
// top-k routed MoE MLP or a dense one), final norm. Each decoder layer is a HookableModule so
// the offload engine can stream layers through device slots.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/kv/kv_cache.h"
#include "model_runner/layers.h"
#include "model_runner/qwen3_omni/config.h"

namespace omni::models::qwen3_omni {

struct MoeRouting;  // moe_routing.h

// The decoder's KV cache is the family-neutral one (model_runner/kv/kv_cache.h).
using models::KeysValues;
using models::KvBatch;
using models::KvCache;

// The KV block pool shape of a decoder of `cfg` (its layers, KV heads and head size).
models::KvPoolShape kv_pool_shape(const TextConfig& cfg, at::ScalarType dtype, c10::Device device,
                                  int64_t block_size, int64_t num_blocks);

// cos / sin [L, head_dim] for position ids [3, L] (temporal, height, width), with the
// frequencies interleaved as Qwen3-Omni does: index i takes its angle from T, except
// i = 1, 4, 7, ... (< 3 * section[1]) from H and i = 2, 5, 8, ... (< 3 * section[2]) from W.
std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const TextConfig& cfg,
                                                const at::Tensor& position_ids,
                                                at::ScalarType dtype);

// cos / sin [L, head_dim] of standard (1-D) rope for positions [L]: the code predictor's.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(double theta, int64_t head_dim,
                                               const at::Tensor& positions, at::ScalarType dtype);

// GQA attention with rope; per-head q/k RMSNorm before rope unless `qk_norm` is false (code2wav).
class TextAttention : public torch::nn::Module {
 public:
  TextAttention(const TextConfig& cfg, at::ScalarType dtype, bool qk_norm = true);
  // x [1, L, hidden], cos / sin [L, head_dim]. `blocked` [L, past + L] (true: the key is not
  // visible) replaces the default causal mask, e.g. for a sliding window.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     KvCache* cache, int64_t layer, const at::Tensor* blocked = nullptr);
  // A batch of sequences, one per row of x [B, L, hidden], each continuing caches[b] (of
  // whatever length); cos / sin [L, head_dim] shared, or [B, L, head_dim] per row. The
  // projections run once for the batch, attention per row over its own cache.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const KvBatch& caches, int64_t layer, const at::Tensor* blocked = nullptr);

 private:
  // Attention of q [b, heads, L, d] over the keys and values [b, kv_heads, len, d] of `runs`,
  // which together hold positions 0 .. past + L - 1 in order (the cache's views with this
  // step's keys appended; one run unless a pooled cache's blocks are not adjacent)
  // -> [b, L, heads * d].
  at::Tensor attend(const at::Tensor& q, const std::vector<KeysValues>& runs, int64_t past,
                    const at::Tensor* blocked);
  int64_t heads_, kv_heads_, head_dim_;
  // 1 / sqrt(head_dim) as a float32 scalar: float32 scores scale without converting a double.
  at::Tensor scaling_f32_;
  float scaling_;  // the same number, for decode_attention
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
  std::shared_ptr<RMSNorm> q_norm_, k_norm_;  // null without qk_norm
};

class TextMlp : public torch::nn::Module {
 public:
  TextMlp(int64_t hidden, int64_t intermediate, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

// What SparseMoe::forward has done so far: which routing plan it took (moe_routing.h) and how
// often it stopped for the host, for tests and benchmarks.
struct MoeStats {
  int64_t decode_forwards = 0;   // routed with MoeRouting::Plan::kDecode (few rows)
  int64_t prefill_forwards = 0;  // routed with MoeRouting::Plan::kPrefill
  int64_t host_copies = 0;       // device-to-host copies: one per forward, none per expert
  int64_t expert_calls = 0;      // run_expert calls: one per hit expert per forward
};

// Expert-level offload's hook into SparseMoe (the runner sets one on a TextModel): told which
// experts a forward hit before any of them runs, so that it brings them to the device in one go
// (one call per MoE layer and forward, or per chunk of capacity() experts), and given the
// experts the next MoE layer is predicted to use so that it can fetch them ahead.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // The most experts one prepare() call can make usable (the device cache's slots).
  virtual size_t capacity() const = 0;
  // Makes `experts` of MoE layer `layer` usable before they run; rows[i] tokens go to
  // experts[i]. Returns, per expert, whether it runs on the host (its weights are host tensors:
  // the rows go to the CPU and the output comes back) instead of the compute device.
  virtual std::vector<bool> prepare(int64_t layer, const std::vector<int64_t>& experts,
                                    const std::vector<int64_t>& rows) = 0;
  // Whether prepare() may place experts on the host (a miss policy other than always fetching):
  // SparseMoe then copies the layer's rows to the host before prepare(), while nothing waits
  // for this layer's expert copies yet.
  virtual bool may_run_on_host() const = 0;
  // Whether SparseMoe should predict the next MoE layer's experts (one extra router product
  // and one small host copy per layer); asked once per forward of MoE layer `layer`, before
  // its prepare(), so that a provider can answer by how well its predictions have done.
  virtual bool wants_prediction(int64_t layer) = 0;
  // The next MoE layer `layer`'s likely experts, most likely first.
  virtual void prefetch(int64_t layer, const std::vector<int64_t>& experts) = 0;
  // A host-placed expert with `rows` tokens took `ms` (the auto miss policy learns from it).
  virtual void host_computed(int64_t layer, int64_t expert, int64_t rows, double ms) = 0;
};

// Router ("gate") + experts stored one module per expert, as on disk
// (mlp.experts.{e}.{gate,up,down}_proj). The talker's adds a shared expert that every token
// uses, scaled by sigmoid(shared_expert_gate(x)). Tokens are grouped by expert on the device
// (moe_routing.h); the host waits for the device once per forward, not once per expert.
class SparseMoe : public torch::nn::Module {
 public:
  SparseMoe(const TextConfig& cfg, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x);
  MoeStats stats() const;
  // Expert offload: `provider` (null: none) is asked for the hit experts of each forward as
  // MoE layer `layer`; with `next_router` (the router of the next MoE layer, `next_layer`), the
  // next layer's experts are predicted from this layer's MoE input (the post-attention-norm
  // hidden state of this layer, which the next router would see after one more layer) and
  // handed to provider->prefetch().
  void set_expert_provider(ExpertProvider* provider, int64_t layer,
                           std::shared_ptr<Linear> next_router, int64_t next_layer);
  const std::shared_ptr<Linear>& router() const { return gate_; }

 private:
  // Experts of the next MoE layer predicted from `flat` (most tokens first), to prefetch.
  std::vector<int64_t> predict_next(const at::Tensor& flat);
  // Runs the hit experts routing.experts[first, first + on_host.size()) over their ranges of
  // the sorted `rows` into outputs[i]: on the compute device, or where on_host, on the host
  // from `host_rows` (rows on the host; copied here when undefined).
  void run_experts(const at::Tensor& rows, at::Tensor& host_rows, const MoeRouting& routing,
                   size_t first, const std::vector<bool>& on_host,
                   std::vector<at::Tensor>& outputs);
  // The one place an expert's weights are used: `rows` [n, hidden] routed to `expert` ->
  // [n, hidden]. Expert offload hooks in here (fetch the expert before it runs, or run it on
  // the host).
  at::Tensor run_expert(int64_t expert, const at::Tensor& rows);

  struct Counters {
    std::atomic<int64_t> decode_forwards{0}, prefill_forwards{0}, host_copies{0}, expert_calls{0};
  };
  Counters counters_;
  int64_t top_k_;
  bool norm_topk_prob_;
  std::shared_ptr<Linear> gate_;
  std::vector<std::shared_ptr<TextMlp>> experts_;
  std::shared_ptr<TextMlp> shared_expert_;  // null without one
  std::shared_ptr<Linear> shared_expert_gate_;
  ExpertProvider* provider_ = nullptr;
  int64_t layer_ = 0, next_layer_ = -1;
  std::shared_ptr<Linear> next_router_;
};

class DecoderLayer : public offload::HookableModule {
 public:
  DecoderLayer(const TextConfig& cfg, int64_t index, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     KvCache* cache);
  // Rows of `hidden` [B, L, hidden] continue caches[b] (TextAttention's batch forward).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const KvBatch& caches);
  // The routed MLP; null in a dense layer.
  SparseMoe* moe() const { return moe_.get(); }

 private:
  int64_t index_;
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<TextAttention> self_attn_;
  std::shared_ptr<torch::nn::Module> mlp_;  // TextMlp or SparseMoe
  std::shared_ptr<TextMlp> dense_;
  std::shared_ptr<SparseMoe> moe_;
};

// Adds DeepStack visual features to the hidden states of the visual positions after the first
// layers of the decoder.
struct DeepStackInput {
  at::Tensor visual_mask;            // [L] bool
  std::vector<at::Tensor> features;  // features[i] [n_visual, hidden] joins after layer i
};

// Hugging Face's hidden_states[layer] of a forward: 0 is the input embeddings, k the output of
// decoder layer k - 1 (before any DeepStack features are added, as HF records them), the last
// (layer == num_hidden_layers) the normalized output.
struct HiddenCapture {
  int64_t layer = -1;  // -1: capture nothing
  at::Tensor hidden;   // [1, L, hidden] after forward
};

// A Qwen3-Omni text decoder: the thinker's ("thinker.model": embed_tokens) and the talker's
// ("talker.model": codec_embedding). A HookableModule with three hooked methods (forward, embed,
// logits) so that it can be a component of its own: every use of its weights goes through them.
class TextModel : public offload::HookableModule {
 public:
  TextModel(const TextConfig& cfg, at::ScalarType dtype,
            const std::string& embedding_name = "embed_tokens");
  // embeds [1, L, hidden], position_ids [3, L] -> normalized hidden states [1, L, hidden].
  at::Tensor forward(const at::Tensor& embeds, const at::Tensor& position_ids, KvCache* cache,
                     const DeepStackInput* deepstack = nullptr, HiddenCapture* capture = nullptr);
  // One decode step of a batch: embeds [B, 1, hidden] continue caches[b] at the positions
  // position_ids [3, B] -> [B, 1, hidden]. Weights are used once for the whole batch.
  at::Tensor forward_batch(const at::Tensor& embeds, const at::Tensor& position_ids,
                           const KvBatch& caches, HiddenCapture* capture = nullptr);
  // Rows of the embedding table.
  at::Tensor embed(const at::Tensor& ids);
  // hidden @ embedding^T: the lm_head of a model with tied word embeddings.
  at::Tensor tied_logits(const at::Tensor& hidden);
  const TextConfig& config() const { return cfg_; }
  // Expert offload: every MoE layer asks `provider` (null: none) for its hit experts, and
  // predicts the next MoE layer's for it (SparseMoe::set_expert_provider).
  void set_expert_provider(ExpertProvider* provider);

 private:
  // The layers and the final norm over `input` with rope cos / sin ([L, d] or [B, L, d]).
  at::Tensor run_layers(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                        const KvBatch& caches, const DeepStackInput* deepstack,
                        HiddenCapture* capture);

  TextConfig cfg_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<torch::nn::Module> layers_holder_;
  std::vector<std::shared_ptr<DecoderLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
};

}  // namespace omni::models::qwen3_omni
