// diffusers' WanTransformer3DModel (Wan2.1 / Wan2.2 T2V and TI2V) on ATen: a 3-D patch
// embedding, a 3-D rotary embedding split over (frames, height, width), timestep and text
// embeddings, `blocks` of self-attention (q/k RMS norm across heads), cross-attention and a
// gelu-tanh FFN modulated by scale/shift/gate, then the output norm and unpatchify.
//
// Parameters carry diffusers' names ("blocks.3.attn1.to_q.weight"), so a `transformer/`
// folder loads with load_weights. The modules diffusers keeps in float32 whatever the compute
// dtype (the time embedder, the scale/shift tables, the block norms) are float32 here too,
// and the casts between them follow diffusers'. Each `blocks.{i}` is a HookableModule, the unit
// the offload engine streams; so is the whole model.
//
// Not supported (rejected by the config reader): I2V's image embedder and added k/v
// projections (`image_dim`, `added_kv_proj_dim`, `pos_embed_seq_len`).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/dit_layers.h"
#include "model_runner/layers.h"

namespace omni::models {

class HfConfig;

struct WanTransformerConfig {
  int64_t patch_t = 1, patch_h = 2, patch_w = 2;
  int64_t num_heads = 40;
  int64_t head_dim = 128;
  int64_t in_channels = 16;
  int64_t out_channels = 16;
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 13824;
  int64_t num_layers = 40;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;

  int64_t inner_dim() const { return num_heads * head_dim; }

  // From a diffusers transformer/config.json; an unsupported value throws naming the file and
  // the field.
  static WanTransformerConfig from_hf(const HfConfig& config);
  // `path`: the config.json or the folder holding it.
  static WanTransformerConfig load(const std::string& path);
};

// torch.nn.RMSNorm with a weight (at::rms_norm).
class WanRMSNorm : public torch::nn::Module {
 public:
  WanRMSNorm(int64_t dim, at::ScalarType dtype, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
};

// WanAttention without image k/v: to_q/to_k/to_v/to_out.0 and norm_q/norm_k over all heads.
// Hookable, like GeluFeedForward: the offload engine's phase granularity streams attn1, attn2
// and ffn of each block as units of their own.
class WanAttention : public offload::HookableModule {
 public:
  WanAttention(const WanTransformerConfig& c, at::ScalarType dtype);
  // x [B, L, D]; context [B, S, D] (cross-attention) or undefined (self-attention); rope_cos /
  // rope_sin [1, L, 1, head_dim] float32, or undefined for none.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& rope_cos,
                     const at::Tensor& rope_sin);

 private:
  int64_t heads_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, to_out_;  // to_out_ is "to_out.0"
  std::shared_ptr<WanRMSNorm> norm_q_, norm_k_;
};

class WanTransformerBlock : public offload::HookableModule {
 public:
  WanTransformerBlock(const WanTransformerConfig& c, at::ScalarType dtype);
  // x [B, L, D]; context [B, S, D] (the embedded text); temb [B, T, 6, D] (T = 1, or L with
  // per-token timesteps); rope_cos / rope_sin [1, L, 1, head_dim] float32.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& temb,
                     const at::Tensor& rope_cos, const at::Tensor& rope_sin);
  // The same for several passes (a request's guidance passes, a batch's requests), each with
  // its own x, context, temb and rotary tables (pass k's are element k of each list), in one
  // hookable call: each phase (attn1, attn2, ffn) runs for every pass before the next, so an
  // offloaded block or phase is on the device once for all of them. Each result is bitwise
  // forward's.
  std::vector<at::Tensor> forward_passes(const std::vector<at::Tensor>& xs,
                                         const std::vector<at::Tensor>& contexts,
                                         const std::vector<at::Tensor>& tembs,
                                         const std::vector<at::Tensor>& rope_cos,
                                         const std::vector<at::Tensor>& rope_sin);

 private:
  std::vector<at::Tensor> run(std::vector<at::Tensor> hs, const std::vector<at::Tensor>& contexts,
                              const std::vector<at::Tensor>& tembs,
                              const std::vector<at::Tensor>& cos,
                              const std::vector<at::Tensor>& sin);

  double eps_;
  bool cross_attn_norm_;
  std::shared_ptr<WanAttention> attn1_, attn2_;
  at::Tensor norm2_weight_, norm2_bias_;  // cross_attn_norm: FP32LayerNorm with affine
  std::shared_ptr<GeluFeedForward> ffn_;
  at::Tensor scale_shift_table_;  // [1, 6, D] float32
};

// One pass through WanTransformer3DModel: forward's three inputs. A request's guidance passes
// share hidden_states and timestep (the same tensors: computed once); a batch's requests each
// bring their own.
struct WanPass {
  at::Tensor hidden_states;
  at::Tensor timestep;
  at::Tensor encoder_hidden_states;
};

class WanTransformer3DModel : public offload::HookableModule {
 public:
  // Parameters uninitialized (bind them with load_weights), in `dtype` except the float32 ones.
  WanTransformer3DModel(const WanTransformerConfig& c, at::ScalarType dtype);

  // hidden_states [B, C_in, F, H, W]; timestep [B], or [B, L] per-token timesteps (TI2V's
  // expand_timesteps; L = the number of patches); encoder_hidden_states [B, S, text_dim]
  // -> [B, C_out, F, H, W].
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& timestep,
                     const at::Tensor& encoder_hidden_states);
  // forward for each pass (a request's guidance passes, the requests of a batch), the blocks
  // visited block-major (every pass through block i before block i + 1): under layerwise, phase
  // or disk offload each block is streamed once a step for all of them, not once a pass. Each
  // output is bitwise forward's.
  std::vector<at::Tensor> forward_passes(const std::vector<WanPass>& passes);

  const WanTransformerConfig& config() const { return c_; }
  at::ScalarType dtype() const { return dtype_; }
  // The offload engine's block list.
  static constexpr const char* kBlocks = "blocks";

  // WanRotaryPosEmbed for a latent of `frames` x `height` x `width` (before patching):
  // cos and sin [1, L, 1, head_dim], float32, on `device`.
  std::pair<at::Tensor, at::Tensor> rotary(int64_t frames, int64_t height, int64_t width,
                                           const c10::Device& device) const;

 private:
  std::vector<at::Tensor> forward_impl(const std::vector<at::Tensor>& hidden_states,
                                       const std::vector<at::Tensor>& timesteps,
                                       const std::vector<at::Tensor>& texts);
  // The time embedding of `timestep` ([B] or [B, tokens]) and its projection: [B, T, D] and
  // [B, T, 6, D] in `dtype`.
  std::pair<at::Tensor, at::Tensor> time_embedding(const at::Tensor& timestep, int64_t batch,
                                                   int64_t tokens, at::ScalarType dtype) const;

  WanTransformerConfig c_;
  at::ScalarType dtype_;
  int64_t t_dim_, h_dim_, w_dim_;
  at::Tensor rope_cos_, rope_sin_;  // [rope_max_seq_len, head_dim] float32, CPU
  at::Tensor patch_weight_, patch_bias_;
  std::shared_ptr<Linear> time_linear_1_, time_linear_2_, time_proj_;
  std::shared_ptr<Linear> text_linear_1_, text_linear_2_;
  torch::nn::ModuleList blocks_;
  std::shared_ptr<Linear> proj_out_;
  at::Tensor scale_shift_table_;  // [1, 2, D] float32
};

// Reads `dir`/config.json and binds diffusion_pytorch_model.safetensors (or its sharded
// index) into a model of compute dtype `dtype` (float32 modules stay float32).
std::shared_ptr<WanTransformer3DModel> load_wan_transformer(const std::string& dir,
                                                            at::ScalarType dtype);

}  // namespace omni::models
