#include "model_runner/diffusion/tiny_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cmath>

#include "cpu_offload/check.h"
#include "module_tree.h"

namespace omni::models {
namespace {

// [B] timesteps in [0, 1] -> [B, dim] sinusoidal features (float32).
at::Tensor timestep_features(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = at::exp(at::arange(half, t.options().dtype(at::kFloat)) *
                       (-std::log(10000.0) / static_cast<double>(half)));
  auto args = (t.to(at::kFloat) * 1000.0).unsqueeze(1) * freqs.unsqueeze(0);
  return at::cat({at::cos(args), at::sin(args)}, 1);
}

}  // namespace

TinyDiffusionConfig TinyDiffusionConfig::preset(const std::string& name) {
  TinyDiffusionConfig c;
  if (name == "tiny") return c;
  if (name == "small") {
    c.text_dim = 512;
    c.text_heads = 8;
    c.dim = 1024;
    c.heads = 16;
    c.blocks = 8;
    c.ffn_dim = 4096;
    c.latent_channels = 16;
    c.latent_size = 32;
    c.vae_channels = 64;
    return c;
  }
  if (name == "wan14b") {
    // Wan2.1-14B DiT block shapes (dim 5120, 40 heads, FFN 13824, 40 blocks) in bf16; a
    // smaller text encoder and VAE, since the bench is about the DiT.
    c.vocab = 1024;
    c.text_dim = 4096;
    c.text_heads = 32;
    c.text_layers = 2;
    c.dim = 5120;
    c.heads = 40;
    c.blocks = 40;
    c.ffn_dim = 13824;
    c.latent_channels = 16;
    c.latent_size = 128;  // 4096 tokens per frame
    c.vae_channels = 128;
    c.dtype = at::kBFloat16;
    return c;
  }
  OMNI_THROW("unknown pipeline preset '", name, "' (expected tiny, small or wan14b)");
}

TextEncoderLayer::TextEncoderLayer(const TinyDiffusionConfig& c, at::Generator& gen)
    : torch::nn::Module("TextEncoderLayer"), heads_(c.text_heads) {
  norm1_ = child<LayerNorm>(*this, "norm1", c.text_dim, gen, c.dtype);
  qkv_ = child<Linear>(*this, "qkv", c.text_dim, 3 * c.text_dim, gen, c.dtype);
  out_ = child<Linear>(*this, "out", c.text_dim, c.text_dim, gen, c.dtype);
  norm2_ = child<LayerNorm>(*this, "norm2", c.text_dim, gen, c.dtype);
  fc1_ = child<Linear>(*this, "fc1", c.text_dim, 4 * c.text_dim, gen, c.dtype);
  fc2_ = child<Linear>(*this, "fc2", 4 * c.text_dim, c.text_dim, gen, c.dtype);
}

at::Tensor TextEncoderLayer::forward(const at::Tensor& x) {
  auto qkv = qkv_->forward(norm1_->forward(x)).chunk(3, -1);
  auto a = attention(split_heads(qkv[0], heads_), split_heads(qkv[1], heads_),
                     split_heads(qkv[2], heads_));
  auto h = x + out_->forward(merge_heads(a));
  return h + fc2_->forward(at::gelu(fc1_->forward(norm2_->forward(h))));
}

TextEncoder::TextEncoder(const TinyDiffusionConfig& c, at::Generator& gen)
    : HookableModule("TextEncoder") {
  embed_ = child<Embedding>(*this, "embed", c.vocab, c.text_dim, gen, c.dtype);
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.text_layers; ++i) {
    layers_->push_back(std::make_shared<TextEncoderLayer>(c, gen));
  }
  norm_ = child<LayerNorm>(*this, "norm", c.text_dim, gen, c.dtype);
}

at::Tensor TextEncoder::forward(const at::Tensor& ids) {
  return invoke("forward", {ids},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto x = embed_->forward(a[0].toTensor());
                  for (const auto& layer : *layers_) x = layer->as<TextEncoderLayer>()->forward(x);
                  return norm_->forward(x);
                })
      .toTensor();
}

SelfAttentionPhase::SelfAttentionPhase(const TinyDiffusionConfig& c, at::Generator& gen)
    : HookableModule("SelfAttentionPhase"), heads_(c.heads) {
  norm_ = child<LayerNorm>(*this, "norm", c.dim, gen, c.dtype);
  qkv_ = child<Linear>(*this, "qkv", c.dim, 3 * c.dim, gen, c.dtype);
  out_ = child<Linear>(*this, "out", c.dim, c.dim, gen, c.dtype);
}

at::Tensor SelfAttentionPhase::forward(const at::Tensor& x, const at::Tensor& shift,
                                       const at::Tensor& scale) {
  return invoke("forward", {x, shift, scale},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto h =
                      norm_->forward(a[0].toTensor()) * (1 + a[2].toTensor()) + a[1].toTensor();
                  auto qkv = qkv_->forward(h).chunk(3, -1);
                  auto o = attention(split_heads(qkv[0], heads_), split_heads(qkv[1], heads_),
                                     split_heads(qkv[2], heads_));
                  return out_->forward(merge_heads(o));
                })
      .toTensor();
}

CrossAttentionPhase::CrossAttentionPhase(const TinyDiffusionConfig& c, at::Generator& gen)
    : HookableModule("CrossAttentionPhase"), heads_(c.heads) {
  norm_ = child<LayerNorm>(*this, "norm", c.dim, gen, c.dtype);
  q_ = child<Linear>(*this, "q", c.dim, c.dim, gen, c.dtype);
  kv_ = child<Linear>(*this, "kv", c.dim, 2 * c.dim, gen, c.dtype);
  out_ = child<Linear>(*this, "out", c.dim, c.dim, gen, c.dtype);
}

at::Tensor CrossAttentionPhase::forward(const at::Tensor& x, const at::Tensor& context) {
  return invoke("forward", {x, context},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto q = q_->forward(norm_->forward(a[0].toTensor()));
                  auto kv = kv_->forward(a[1].toTensor()).chunk(2, -1);
                  auto o = attention(split_heads(q, heads_), split_heads(kv[0], heads_),
                                     split_heads(kv[1], heads_));
                  return out_->forward(merge_heads(o));
                })
      .toTensor();
}

FeedForwardPhase::FeedForwardPhase(const TinyDiffusionConfig& c, at::Generator& gen)
    : HookableModule("FeedForwardPhase") {
  norm_ = child<LayerNorm>(*this, "norm", c.dim, gen, c.dtype);
  fc1_ = child<Linear>(*this, "fc1", c.dim, c.ffn_dim, gen, c.dtype);
  fc2_ = child<Linear>(*this, "fc2", c.ffn_dim, c.dim, gen, c.dtype);
}

at::Tensor FeedForwardPhase::forward(const at::Tensor& x, const at::Tensor& shift,
                                     const at::Tensor& scale) {
  return invoke("forward", {x, shift, scale},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto h =
                      norm_->forward(a[0].toTensor()) * (1 + a[2].toTensor()) + a[1].toTensor();
                  return fc2_->forward(at::gelu(fc1_->forward(h), "tanh"));
                })
      .toTensor();
}

DiTBlock::DiTBlock(const TinyDiffusionConfig& c, at::Generator& gen) : HookableModule("DiTBlock") {
  modulation_ = register_parameter("modulation", init_normal({6, c.dim}, 0.02, gen, c.dtype),
                                   /*requires_grad=*/false);
  self_attn_ = child<SelfAttentionPhase>(*this, "self_attn", c, gen);
  cross_attn_ = child<CrossAttentionPhase>(*this, "cross_attn", c, gen);
  ffn_ = child<FeedForwardPhase>(*this, "ffn", c, gen);
}

at::Tensor DiTBlock::forward(const at::Tensor& x, const at::Tensor& context,
                             const at::Tensor& temb) {
  return invoke("forward", {x, context, temb},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto h = a[0].toTensor();
                  const auto& ctx = a[1].toTensor();
                  auto e = (modulation_.unsqueeze(0) + a[2].toTensor()).chunk(6, 1);  // 6 x [B,1,D]
                  h = h + e[2] * self_attn_->forward(h, e[0], e[1]);
                  h = h + cross_attn_->forward(h, ctx);
                  return h + e[5] * ffn_->forward(h, e[3], e[4]);
                })
      .toTensor();
}

DiT::DiT(const TinyDiffusionConfig& c, at::Generator& gen) : HookableModule("DiT"), c_(c) {
  OMNI_CHECK(c.latent_size % c.patch == 0, "latent_size ", c.latent_size,
             " must be divisible by patch ", c.patch);
  const int64_t tokens = (c.latent_size / c.patch) * (c.latent_size / c.patch);
  const int64_t patch_dim = c.latent_channels * c.patch * c.patch;
  patch_embed_ = child<Linear>(*this, "patch_embed", patch_dim, c.dim, gen, c.dtype);
  pos_embed_ =
      register_parameter("pos_embed", init_normal({1, tokens, c.dim}, 0.02, gen, c.dtype), false);
  text_proj_ = child<Linear>(*this, "text_proj", c.text_dim, c.dim, gen, c.dtype);
  time_fc1_ = child<Linear>(*this, "time_fc1", c.dim, c.dim, gen, c.dtype);
  time_fc2_ = child<Linear>(*this, "time_fc2", c.dim, c.dim, gen, c.dtype);
  time_proj_ = child<Linear>(*this, "time_proj", c.dim, 6 * c.dim, gen, c.dtype);
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.blocks; ++i) blocks_->push_back(std::make_shared<DiTBlock>(c, gen));
  norm_out_ = child<LayerNorm>(*this, "norm_out", c.dim, gen, c.dtype);
  proj_out_ = child<Linear>(*this, "proj_out", c.dim, patch_dim, gen, c.dtype);
}

at::Tensor DiT::forward(const at::Tensor& latents, const at::Tensor& timestep,
                        const at::Tensor& context) {
  return invoke("forward", {latents, timestep, context},
                [this](offload::HookArgs& a) -> c10::IValue {
                  const auto& lat = a[0].toTensor();
                  const int64_t b = lat.size(0), ch = c_.latent_channels, p = c_.patch;
                  const int64_t g = c_.latent_size / p;
                  auto x = lat.view({b, ch, g, p, g, p})
                               .permute({0, 2, 4, 1, 3, 5})
                               .reshape({b, g * g, ch * p * p});
                  x = patch_embed_->forward(x) + pos_embed_;
                  auto ctx = text_proj_->forward(a[2].toTensor());
                  auto t = timestep_features(a[1].toTensor(), c_.dim).to(c_.dtype);
                  auto temb = time_fc2_->forward(at::silu(time_fc1_->forward(t)));
                  auto mod = time_proj_->forward(at::silu(temb)).view({b, 6, c_.dim});
                  for (const auto& block : *blocks_)
                    x = block->as<DiTBlock>()->forward(x, ctx, mod);
                  x = proj_out_->forward(norm_out_->forward(x));
                  return x.view({b, g, g, ch, p, p})
                      .permute({0, 3, 1, 4, 2, 5})
                      .reshape({b, ch, g * p, g * p});
                })
      .toTensor();
}

VaeDecoder::VaeDecoder(const TinyDiffusionConfig& c, at::Generator& gen)
    : HookableModule("VaeDecoder", {"forward", "decode"}) {
  conv_in_ = child<Conv2d>(*this, "conv_in", c.latent_channels, c.vae_channels, 3, gen, c.dtype);
  up1_ = child<Conv2d>(*this, "up1", c.vae_channels, c.vae_channels, 3, gen, c.dtype);
  up2_ = child<Conv2d>(*this, "up2", c.vae_channels, c.vae_channels, 3, gen, c.dtype);
  conv_out_ = child<Conv2d>(*this, "conv_out", c.vae_channels, 3, 3, gen, c.dtype);
}

at::Tensor VaeDecoder::decode(const at::Tensor& latents) {
  return invoke("decode", {latents},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto x = at::silu(conv_in_->forward(a[0].toTensor()));
                  x = at::silu(
                      up1_->forward(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2})));
                  x = at::silu(
                      up2_->forward(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2})));
                  return at::tanh(conv_out_->forward(x));
                })
      .toTensor();
}

TinyDiffusionPipeline::TinyDiffusionPipeline(const TinyDiffusionConfig& config)
    : torch::nn::Module("TinyDiffusionPipeline"), config_(config) {
  OMNI_CHECK(config.dim % config.heads == 0 && config.text_dim % config.text_heads == 0,
             "dims must be divisible by their head counts");
  at::Generator gen = at::detail::createCPUGenerator(config.seed);
  text_encoder_ = child<TextEncoder>(*this, "text_encoder", config, gen);
  transformer_ = child<DiT>(*this, "transformer", config, gen);
  if (config.two_transformers) transformer_2_ = child<DiT>(*this, "transformer_2", config, gen);
  vae_ = child<VaeDecoder>(*this, "vae", config, gen);
}

at::Tensor TinyDiffusionPipeline::generate(const at::Tensor& prompt, const at::Tensor& negative,
                                           const GenerateOptions& options, c10::Device device) {
  OMNI_CHECK(options.steps >= 1, "steps must be >= 1, got ", options.steps);
  c10::InferenceMode inference;
  const bool cfg = options.guidance_scale != 1.0;
  auto context = text_encoder_->forward(prompt.to(device));
  at::Tensor uncond = cfg ? text_encoder_->forward(negative.to(device)) : at::Tensor();

  at::Generator gen = at::detail::createCPUGenerator(options.seed);
  const int64_t b = prompt.size(0);
  auto latents = at::randn({b, config_.latent_channels, config_.latent_size, config_.latent_size},
                           gen, at::TensorOptions(at::kFloat))
                     .to(device, config_.dtype);
  const double dt = 1.0 / options.steps;
  for (int i = 0; i < options.steps; ++i) {
    const bool second = transformer_2_ && i >= options.boundary * options.steps;
    DiT& dit = second ? *transformer_2_ : *transformer_;
    auto t = at::full({b}, 1.0 - i * dt, at::TensorOptions(at::kFloat).device(device));
    auto v = dit.forward(latents, t, context);
    if (cfg) {
      auto vu = dit.forward(latents, t, uncond);
      v = vu + options.guidance_scale * (v - vu);
    }
    latents = latents - dt * v;
  }
  return vae_->decode(latents);
}

offload::ModelSpec TinyDiffusionPipeline::offload_spec() const {
  offload::ModelSpec spec;
  spec.dits = {"transformer"};
  if (transformer_2_) spec.dits.push_back("transformer_2");
  spec.encoders = {"text_encoder"};
  spec.vaes = {"vae"};
  for (const auto& dit : spec.dits) {
    spec.block_lists.push_back({dit + ".blocks", {"self_attn", "cross_attn", "ffn"}});
  }
  return spec;
}

at::Tensor example_prompt(int64_t batch, int64_t length, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {batch, length}, gen, at::TensorOptions(at::kLong));
}

}  // namespace omni::models
