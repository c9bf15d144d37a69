// diffusers' AutoencoderKLWan, the causal 3-D video VAE of Wan2.1 (z_dim 16, 8x spatial) and
// Wan2.2-TI2V (z_dim 48, residual down/up blocks with the avg-down / dup-up shortcuts, a 2x2
// patchify around the encoder and decoder: 16x spatial), both 4x temporal. It also loads
// diffusers' AutoencoderKLQwenImage (Qwen-Image's VAE, fine-tuned from Wan2.1's): the same
// network, parameter names and forward (checked equal bit for bit in diffusers 0.42.1); its
// config names one `input_channels` in place of in_channels / out_channels and has none of the
// Wan2.2 fields. Qwen-Image runs it on single frames ([B, 3, 1, H, W] <-> [B, 16, 1, H/8, W/8]).
//
// Video runs through it causally, chunk by chunk, as diffusers' _encode / _decode do: the
// encoder takes the first frame, then groups of 4; the decoder one latent frame at a time
// (giving 1, then 4 frames each). Every causal 3-D convolution keeps the last frames of its
// input in a feature cache between chunks, so a chunk's intermediate activations are freed
// before the next one starts: a decode holds one chunk's features plus that cache, never the
// whole video's.
//
// Parameters carry diffusers' names ("decoder.up_blocks.0.resnets.1.conv2.weight"), so a `vae/`
// folder loads with load_weights. `encoder` and `decoder` are HookableModules (with
// quant_conv / post_quant_conv, diffusers' group-offload units); so is the whole model.
//
// latents_mean / latents_std are NOT applied by encode() or decode(), as in diffusers: the
// pipelines scale (WanPipeline and QwenImagePipeline: latents / (1 / std) + mean before
// vae.decode; the I2V / TI2V image conditioning: (mean - latents_mean) * (1 / std) after
// vae.encode, QwenImageEditPipeline's: (mean - latents_mean) / std, the same up to the last
// bit). normalize_latents / denormalize_latents do that for the caller.
//
// Not supported (rejected by the config reader): attn_scales (diffusers' own encoder cannot run
// with attention in its down blocks either). Tiling and slicing are not implemented (not needed
// for equality: diffusers' default decode does neither). The untiled decode clamps to [-1, 1]
// in both diffusers classes (only their tiled decodes differ: AutoencoderKLQwenImage's does not
// clamp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"

namespace omni::models {

class HfConfig;

struct WanVAEConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 96;  // = base_dim when the config has null
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult{1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temperal_downsample{false, true, true};  // diffusers' spelling
  std::vector<double> latents_mean, latents_std;             // z_dim each
  bool is_residual = false;
  int64_t in_channels = 3;   // AutoencoderKLQwenImage: input_channels
  int64_t out_channels = 3;  // AutoencoderKLQwenImage: input_channels
  int64_t patch_size = 1;    // 1 when the config has null (no patchify)
  // AutoencoderKLQwenImage has no such fields: there, the factors of the stages (8 and 4).
  int64_t scale_factor_temporal = 4;
  int64_t scale_factor_spatial = 8;

  // From a diffusers vae/config.json of _class_name AutoencoderKLWan (the default) or
  // AutoencoderKLQwenImage; an unsupported value throws naming the file and field. Absent
  // latents_mean / latents_std: diffusers' default tables when z_dim is 16, else 0 / 1.
  static WanVAEConfig from_hf(const HfConfig& config);
  // `path`: the config.json or the folder holding it.
  static WanVAEConfig load(const std::string& path);
};

// diffusers' feat_cache / feat_idx: one slot per cached causal convolution, filled in call
// order during a chunk and read back in the same order during the next.
struct WanFeatureCache {
  std::vector<at::Tensor> slots;
  std::vector<bool> rep;  // upsample3d's "Rep" marker: seen once, no frames cached yet
  size_t index = 0;

  // The next slot's index (growing the cache on the first chunk).
  size_t next();
  void clear();
  // Starts a chunk: the slots are read from the first again.
  void rewind() { index = 0; }
};

// A causal Conv3d (WanCausalConv3d): zero-padded by 2 * padding_t frames in front only, or by
// as many of them as the cached frames do not cover. "weight" / "bias".
class WanCausalConv3d : public torch::nn::Module {
 public:
  WanCausalConv3d(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, at::ScalarType dtype);
  // x [B, C, T, H, W]; cache: the previous chunk's last frames, or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cache = {}) const;

  at::Tensor weight, bias;

 private:
  std::vector<int64_t> stride_, padding_;
};

// One layer of the encoder or decoder that runs under the feature cache.
class WanVAELayer : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  // first_chunk: the decoder's first latent frame (DupUp3D's trim).
  virtual at::Tensor forward(const at::Tensor& x, WanFeatureCache& cache, bool first_chunk) = 0;
};

// WanEncoder3d: conv_in, down_blocks, mid_block, norm_out, silu, conv_out (2 * z_dim channels).
// One chunk per forward; the cache lives here between chunks.
class WanVAEEncoder : public offload::HookableModule {
 public:
  WanVAEEncoder(const WanVAEConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& chunk);
  void clear_cache() { cache_.clear(); }

 private:
  WanFeatureCache cache_;
  std::shared_ptr<WanCausalConv3d> conv_in_, conv_out_;
  torch::nn::ModuleList down_blocks_;
  std::shared_ptr<WanVAELayer> mid_block_;
  at::Tensor norm_out_gamma_;
};

// WanDecoder3d: conv_in, mid_block, up_blocks, norm_out, silu, conv_out. One latent frame per
// forward; the cache lives here between frames.
class WanVAEDecoder : public offload::HookableModule {
 public:
  WanVAEDecoder(const WanVAEConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& chunk, bool first_chunk);
  void clear_cache() { cache_.clear(); }

 private:
  WanFeatureCache cache_;
  std::shared_ptr<WanCausalConv3d> conv_in_, conv_out_;
  std::shared_ptr<WanVAELayer> mid_block_;
  torch::nn::ModuleList up_blocks_;
  at::Tensor norm_out_gamma_;
};

// The encoder's diagonal Gaussian (DiagonalGaussianDistribution): mean is also its mode.
struct WanLatentDistribution {
  at::Tensor mean;    // [B, z_dim, F, h, w]
  at::Tensor logvar;  // clamped to [-30, 20], as diffusers does
  const at::Tensor& mode() const { return mean; }
};

class AutoencoderKLWan : public offload::HookableModule {
 public:
  // Parameters uninitialized (bind them with load_weights), in `dtype`.
  AutoencoderKLWan(const WanVAEConfig& c, at::ScalarType dtype);

  // diffusers' _decode without tiling: latents [B, z_dim, F, h, w] (already de-normalized; see
  // denormalize_latents) -> video [B, 3, 1 + 4 (F - 1), h * s, w * s] in [-1, 1] (s the spatial
  // factor, 8 or 16), in the parameters' dtype.
  at::Tensor decode(const at::Tensor& latents);
  // decode a chunk at a time: `on_chunk` gets each latent frame's frames [B, 3, f, H, W] as
  // they are decoded (the first latent frame gives 1, each next 4), so a caller that consumes
  // them holds one chunk's frames, not the video's. decode's bits, chunk by chunk.
  void decode_chunks(const at::Tensor& latents,
                     const std::function<void(const at::Tensor&)>& on_chunk);
  // diffusers' encode(...).latent_dist without tiling: video [B, 3, T, H, W] in [-1, 1]
  // (T = 1 + 4k) -> the latent distribution (mean / mode [B, z_dim, 1 + k, H / s, W / s]).
  WanLatentDistribution encode(const at::Tensor& video);

  // The pipelines' scaling around the VAE (not applied by decode / encode):
  // (x - latents_mean) / latents_std, and its inverse x * latents_std + latents_mean. Wan's
  // pipelines multiply by 1 / std, the Qwen-Image Edit pipelines divide by std.
  enum class StdScaling { kMultiplyInverse, kDivide };
  at::Tensor normalize_latents(const at::Tensor& latents,
                               StdScaling how = StdScaling::kMultiplyInverse) const;
  at::Tensor denormalize_latents(const at::Tensor& latents) const;

  const WanVAEConfig& config() const { return c_; }
  WanVAEEncoder& encoder() { return *encoder_; }
  WanVAEDecoder& decoder() { return *decoder_; }

 private:
  WanVAEConfig c_;
  std::shared_ptr<WanVAEEncoder> encoder_;
  std::shared_ptr<WanVAEDecoder> decoder_;
  std::shared_ptr<WanCausalConv3d> quant_conv_, post_quant_conv_;
};

// Reads `dir`/config.json and binds diffusion_pytorch_model.safetensors (or its sharded index)
// into a model of dtype `dtype`.
std::shared_ptr<AutoencoderKLWan> load_wan_vae(const std::string& dir, at::ScalarType dtype);

}  // namespace omni::models
