// diffusers' QwenImageTransformer2DModel (Qwen-Image, Qwen-Image-Edit) on ATen: an MMDiT whose
// `transformer_blocks` each hold an image stream and a text stream (their own modulation,
// layer norms and gelu-tanh FFNs) joined by one attention over [text, image] with RMS q/k norm
// and a 3-axis complex rotary embedding; text positions continue after the image extent.
//
// Parameters carry diffusers' names ("transformer_blocks.3.attn.add_q_proj.weight"), so a
// `transformer/` folder loads with load_weights. Each block is a HookableModule, the unit the
// offload engine streams; its phases (img_mod, txt_mod, attn, img_mlp, txt_mlp) are too.
//
// Not supported (rejected by the config reader): the guidance embedding, Edit-2511's
// `zero_cond_t`, Layered's `use_additional_t_cond` and `use_layer3d_rope`.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/dit_layers.h"
#include "model_runner/layers.h"

namespace omni::models {

class HfConfig;

struct QwenImageTransformerConfig {
  int64_t patch_size = 2;
  int64_t in_channels = 64;  // packed latents: 16 channels x 2 x 2
  int64_t out_channels = 16;
  int64_t num_layers = 60;
  int64_t head_dim = 128;
  int64_t num_heads = 24;
  int64_t joint_attention_dim = 3584;                 // the text encoder's width
  std::array<int64_t, 3> axes_dims_rope{16, 56, 56};  // (frame, height, width); sums to head_dim

  int64_t inner_dim() const { return num_heads * head_dim; }

  // From a diffusers transformer/config.json; an unsupported value throws naming the file and
  // the field.
  static QwenImageTransformerConfig from_hf(const HfConfig& config);
  // `path`: the config.json or the folder holding it.
  static QwenImageTransformerConfig load(const std::string& path);
};

// One image of the transformer's sequence, in patches: Qwen-Image has one (the latent being
// denoised); Edit appends each condition image's latents after it.
struct QwenImageShape {
  int64_t frames = 1, height = 0, width = 0;
};

// The joint attention's rotary angles as float32 cos / sin [L, head_dim / 2], one pair per
// complex channel: the image tokens' and the text tokens'.
struct QwenImageRotary {
  at::Tensor image_cos, image_sin, text_cos, text_sin;
};

// nn.Sequential(SiLU, Linear(dim, 6 * dim)): the shift / scale / gate of a stream's two norms.
class QwenImageModulation : public offload::HookableModule {
 public:
  QwenImageModulation(int64_t dim, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& temb);  // [B, D] -> [B, 6 * D]

 private:
  std::shared_ptr<Linear> linear_;  // "1"
};

// Attention(added_kv_proj_dim = dim, qk_norm = "rms_norm") with QwenDoubleStreamAttnProcessor.
class QwenImageJointAttention : public offload::HookableModule {
 public:
  QwenImageJointAttention(const QwenImageTransformerConfig& c, at::ScalarType dtype);
  // image [B, L, D], text [B, S, D]; text_mask [B, S] bool or undefined (every token valid)
  // -> (image output [B, L, D], text output [B, S, D]).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& text_mask,
                                            const QwenImageRotary& rotary);

 private:
  int64_t heads_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, to_out_;  // to_out_ is "to_out.0"
  std::shared_ptr<Linear> add_q_proj_, add_k_proj_, add_v_proj_, to_add_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

// One pass's activations through the blocks (the guidance passes differ in their text).
struct QwenImagePass {
  at::Tensor image, text;  // [B, L, D], [B, S, D]
  at::Tensor text_mask;    // [B, S] bool (true: a token) or undefined
  QwenImageRotary rotary;
};

class QwenImageTransformerBlock : public offload::HookableModule {
 public:
  QwenImageTransformerBlock(const QwenImageTransformerConfig& c, at::ScalarType dtype);
  // image [B, L, D], text [B, S, D], temb [B, D] -> (image, text).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& text_mask, const at::Tensor& temb,
                                            const QwenImageRotary& rotary);
  // The same for several passes in place, one hookable call: each phase (attn, img_mlp,
  // txt_mlp; the modulations once) runs for every pass before the next, so an offloaded block
  // or phase is on the device once for all of them. Each result is bitwise forward's.
  void forward_passes(std::vector<QwenImagePass>& passes, const at::Tensor& temb);

 private:
  void run(std::vector<QwenImagePass>& passes, const at::Tensor& temb);

  std::shared_ptr<QwenImageModulation> img_mod_, txt_mod_;
  std::shared_ptr<QwenImageJointAttention> attn_;
  std::shared_ptr<GeluFeedForward> img_mlp_, txt_mlp_;
};

// A pass's text: embeddings [B, S, joint_attention_dim] and mask [B, S] (or undefined).
struct QwenImageText {
  at::Tensor embeds, mask;
};

class QwenImageTransformer2DModel : public offload::HookableModule {
 public:
  // Parameters uninitialized (bind them with load_weights), in `dtype`.
  QwenImageTransformer2DModel(const QwenImageTransformerConfig& c, at::ScalarType dtype);

  // hidden_states [B, L, in_channels]: the packed latents of `images` in order (L = the sum of
  // their frames x height x width); encoder_hidden_states [B, S, joint_attention_dim];
  // text_mask [B, S] (nonzero: a real token) or undefined for all valid; timestep [B], the
  // pipeline's t / 1000 -> [B, L, patch_size^2 * out_channels].
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& text_mask, const at::Tensor& timestep,
                     const std::vector<QwenImageShape>& images);
  // forward for each of `texts` (the guidance passes: conditional, then unconditional) over the
  // same latents and timestep, the blocks visited block-major (every pass through block i before
  // block i + 1): under layerwise, phase or disk offload each block is streamed once a step
  // instead of once a pass. Each output is bitwise forward's.
  std::vector<at::Tensor> forward_passes(const at::Tensor& hidden_states,
                                         const std::vector<QwenImageText>& texts,
                                         const at::Tensor& timestep,
                                         const std::vector<QwenImageShape>& images);

  // QwenEmbedRope(scale_rope = True) for `images` and `text_len` text tokens, on `device`.
  QwenImageRotary rotary(const std::vector<QwenImageShape>& images, int64_t text_len,
                         const c10::Device& device) const;

  const QwenImageTransformerConfig& config() const { return c_; }
  at::ScalarType dtype() const { return dtype_; }
  // The offload engine's block list and each block's phases, in execution order.
  static constexpr const char* kBlocks = "transformer_blocks";
  static std::vector<std::string> block_phases();

 private:
  void check_inputs(const at::Tensor& hidden_states, const std::vector<QwenImageText>& texts,
                    const at::Tensor& timestep, const std::vector<QwenImageShape>& images) const;
  std::vector<at::Tensor> run(const at::Tensor& hidden_states,
                              const std::vector<QwenImageText>& texts, const at::Tensor& timestep,
                              const std::vector<QwenImageShape>& images);

  QwenImageTransformerConfig c_;
  at::ScalarType dtype_;
  std::shared_ptr<Linear> time_linear_1_, time_linear_2_;
  std::shared_ptr<RMSNorm> txt_norm_;
  std::shared_ptr<Linear> img_in_, txt_in_;
  torch::nn::ModuleList blocks_;
  std::shared_ptr<Linear> norm_out_linear_, proj_out_;
};

// Reads `dir`/config.json and binds diffusion_pytorch_model.safetensors (or its sharded index)
// into a model of `dtype`.
std::shared_ptr<QwenImageTransformer2DModel> load_qwen_image_transformer(const std::string& dir,
                                                                         at::ScalarType dtype);

}  // namespace omni::models
