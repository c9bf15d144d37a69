#include "model_runner/qwen3_omni/code2wav.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "config_checks.h"
#include "cpu_offload/check.h"
#include "few_channel_conv.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/text_model.h"
#include "model_runner/weights/hf_config.h"
#include "snake_beta.h"

namespace omni::models::qwen3_omni {

using offload::HookArgs;

// ---------------------------------------------------------------------------- config

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

std::vector<int64_t> positive_list(const HfConfig& cfg, const std::string& field,
                                   const std::vector<int64_t>& default_value) {
  auto v = cfg.get_int_list(field, default_value);
  require(!v.empty(), cfg, field, "must not be empty");
  for (int64_t x : v) require(x > 0, cfg, field, "entries must be > 0, got " + std::to_string(x));
  return v;
}

}  // namespace

int64_t Code2WavConfig::samples_per_frame() const {
  int64_t n = 1;
  for (int64_t r : upsampling_ratios) n *= r;
  for (int64_t r : upsample_rates) n *= r;
  return n;
}

Code2WavConfig parse_code2wav_config(const HfConfig& root) {
  if (!root.has("code2wav_config")) {
    const auto archs = root.architectures();
    OMNI_THROW(root.source(), ": code2wav_config is missing (",
               archs.empty() ? std::string("no architectures") : "architectures " + archs[0],
               "); code2wav needs a Qwen3OmniMoeForConditionalGeneration checkpoint");
  }
  const HfConfig c = root.sub("code2wav_config");
  Code2WavConfig cfg;
  cfg.codebook_size = positive(c, "codebook_size", cfg.codebook_size);
  cfg.hidden_size = positive(c, "hidden_size", cfg.hidden_size);
  cfg.num_attention_heads = positive(c, "num_attention_heads", cfg.num_attention_heads);
  cfg.num_key_value_heads = positive(c, "num_key_value_heads", cfg.num_key_value_heads);
  const bool explicit_head_dim = c.has("head_dim");
  cfg.head_dim =
      explicit_head_dim ? positive(c, "head_dim") : cfg.hidden_size / cfg.num_attention_heads;
  cfg.intermediate_size = positive(c, "intermediate_size", cfg.intermediate_size);
  cfg.num_hidden_layers = positive(c, "num_hidden_layers", cfg.num_hidden_layers);
  cfg.num_quantizers = positive(c, "num_quantizers", cfg.num_quantizers);
  cfg.sliding_window = positive(c, "sliding_window", cfg.sliding_window);
  cfg.rms_norm_eps = c.get_double("rms_norm_eps", cfg.rms_norm_eps);
  cfg.attention_bias = c.get_bool("attention_bias", cfg.attention_bias);
  cfg.upsample_rates = positive_list(c, "upsample_rates", cfg.upsample_rates);
  cfg.upsampling_ratios = positive_list(c, "upsampling_ratios", cfg.upsampling_ratios);
  cfg.decoder_dim = positive(c, "decoder_dim", cfg.decoder_dim);
  cfg.hidden_act = c.get_string("hidden_act", cfg.hidden_act);

  // Rope: "rope_parameters" (transformers >= 5) or "rope_theta" (+ "rope_scaling") as the
  // released checkpoint's config.json, written by 4.x, has it.
  std::string rope_type = "default", rope_type_field = "rope_parameters.rope_type";
  if (c.has("rope_parameters")) {
    cfg.rope_theta = c.get_double("rope_parameters.rope_theta", cfg.rope_theta);
    rope_type = c.get_string("rope_parameters.rope_type", rope_type);
  } else {
    cfg.rope_theta = c.get_double("rope_theta", cfg.rope_theta);
    rope_type_field = "rope_scaling.rope_type";
    if (c.has("rope_scaling")) {
      rope_type = c.has("rope_scaling.rope_type") ? c.get_string("rope_scaling.rope_type")
                                                  : c.get_string("rope_scaling.type", rope_type);
    }
  }
  require(rope_type == "default", c, rope_type_field,
          "only \"default\" rope is supported, got \"" + rope_type + "\"");
  require(cfg.rope_theta > 0, c,
          c.has("rope_parameters") ? "rope_parameters.rope_theta" : "rope_theta", "must be > 0");

  require(cfg.rms_norm_eps > 0, c, "rms_norm_eps", "must be > 0");
  if (!explicit_head_dim) {
    require(cfg.hidden_size % cfg.num_attention_heads == 0, c, "num_attention_heads",
            "must divide hidden_size (" + std::to_string(cfg.hidden_size) + ")");
  }
  require(cfg.num_attention_heads % cfg.num_key_value_heads == 0, c, "num_key_value_heads",
          "must divide num_attention_heads (" + std::to_string(cfg.num_attention_heads) + ")");
  require(cfg.head_dim % 2 == 0, c, explicit_head_dim ? "head_dim" : "num_attention_heads",
          "the head dimension (" + std::to_string(cfg.head_dim) + ") must be even for rope");
  require(cfg.hidden_act == "silu", c, "hidden_act",
          "only silu is supported, got \"" + cfg.hidden_act + "\"");
  const auto blocks = static_cast<int64_t>(cfg.upsample_rates.size());
  require(blocks < 62 && cfg.decoder_dim % (int64_t{1} << blocks) == 0, c, "decoder_dim",
          "must be divisible by 2^len(upsample_rates) = 2^" + std::to_string(blocks) + ", got " +
              std::to_string(cfg.decoder_dim));
  return cfg;
}

void check_speech_configs(const HfConfig& root) {
  const ThinkerConfig thinker = parse_thinker_config(root);
  const TalkerConfig talker = parse_talker_config(root, thinker);
  const Code2WavConfig code2wav = parse_code2wav_config(root);
  OMNI_CHECK(code2wav.num_quantizers == talker.num_code_groups, root.source(),
             ": code2wav_config.num_quantizers ", code2wav.num_quantizers,
             " differs from talker_config.num_code_groups ", talker.num_code_groups);
  // The talker may sample ids below vocab - 1024 (the rest are special): all must be codes.
  OMNI_CHECK(talker.text.vocab_size - 1024 <= code2wav.codebook_size, root.source(),
             ": talker_config.text_config.vocab_size - 1024 = ", talker.text.vocab_size - 1024,
             " sampleable codes exceed code2wav_config.codebook_size ", code2wav.codebook_size);
  OMNI_CHECK(code2wav.codebook_size == talker.code_predictor.vocab_size, root.source(),
             ": code2wav_config.codebook_size ", code2wav.codebook_size,
             " differs from talker_config.code_predictor_config.vocab_size ",
             talker.code_predictor.vocab_size);
}

void validate_codes(const Code2WavConfig& cfg, const at::Tensor& codes, int64_t first_frame) {
  OMNI_CHECK(codes.defined(), "code2wav: codes are undefined");
  if (codes.dim() != 2 || codes.size(0) != cfg.num_quantizers) {
    OMNI_THROW("code2wav: codes must be [num_quantizers = ", cfg.num_quantizers, ", frames], got ",
               shape_of(codes), " (wrong number of code groups)");
  }
  if (!at::isIntegralType(codes.scalar_type(), /*includeBool=*/false)) {
    OMNI_THROW("code2wav: codes must be integers (int64), got ", codes.scalar_type());
  }
  if (codes.numel() == 0) return;
  const auto bad = (codes < 0).logical_or_(codes >= cfg.codebook_size);
  if (!bad.any().item<bool>()) return;
  const auto where = at::nonzero(bad).select(0, 0).cpu();
  const int64_t group = where[0].item<int64_t>(), frame = where[1].item<int64_t>();
  OMNI_THROW("code2wav: code ", codes[group][frame].item<int64_t>(), " of group ", group,
             " at frame ", first_frame + frame,
             " is outside [0, codebook_size = ", cfg.codebook_size, ")");
}

// ---------------------------------------------------------------------------- building blocks

namespace {

// nn.Conv1d / nn.ConvTranspose1d parameters ("weight", "bias").
class ConvWeights : public torch::nn::Module {
 public:
  ConvWeights(at::IntArrayRef weight_shape, int64_t channels_out, at::ScalarType dtype)
      : torch::nn::Module("ConvWeights") {
    weight = register_parameter("weight", uninitialized(weight_shape, dtype), false);
    bias = register_parameter("bias", uninitialized({channels_out}, dtype), false);
  }
  at::Tensor weight, bias;
};

// Qwen3OmniMoeCode2WavLayerScale: scale * x.
class LayerScale : public torch::nn::Module {
 public:
  LayerScale(int64_t channels, at::ScalarType dtype) : torch::nn::Module("LayerScale") {
    scale = register_parameter("scale", uninitialized({channels}, dtype), false);
  }
  at::Tensor forward(const at::Tensor& x) const { return scale * x; }
  at::Tensor scale;
};

// code2wav's attention is the decoders' without q/k norm: its sizes as a TextConfig.
TextConfig attention_config(const Code2WavConfig& c) {
  TextConfig t;
  t.hidden_size = c.hidden_size;
  t.num_attention_heads = c.num_attention_heads;
  t.num_key_value_heads = c.num_key_value_heads;
  t.head_dim = c.head_dim;
  t.attention_bias = c.attention_bias;
  t.rms_norm_eps = c.rms_norm_eps;
  return t;
}

}  // namespace

// Qwen3OmniMoeCode2WavTransformerLayer: pre-norm attention and MLP, each residual scaled.
class Code2WavTransformerLayer : public torch::nn::Module {
 public:
  Code2WavTransformerLayer(const Code2WavConfig& cfg, at::ScalarType dtype)
      : torch::nn::Module("Code2WavTransformerLayer") {
    self_attn_ = register_module("self_attn", std::make_shared<TextAttention>(
                                                  attention_config(cfg), dtype, /*qk_norm=*/false));
    mlp_ = register_module(
        "mlp", std::make_shared<TextMlp>(cfg.hidden_size, cfg.intermediate_size, dtype));
    input_layernorm_ = register_module(
        "input_layernorm", std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
    post_attention_layernorm_ =
        register_module("post_attention_layernorm",
                        std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
    self_attn_layer_scale_ = register_module("self_attn_layer_scale",
                                             std::make_shared<LayerScale>(cfg.hidden_size, dtype));
    mlp_layer_scale_ =
        register_module("mlp_layer_scale", std::make_shared<LayerScale>(cfg.hidden_size, dtype));
  }

  at::Tensor forward(const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& blocked) {
    auto x = h + self_attn_layer_scale_->forward(self_attn_->forward(
                     input_layernorm_->forward(h), cos, sin, /*cache=*/nullptr, 0, &blocked));
    return x + mlp_layer_scale_->forward(mlp_->forward(post_attention_layernorm_->forward(x)));
  }

 private:
  std::shared_ptr<TextAttention> self_attn_;
  std::shared_ptr<TextMlp> mlp_;  // gate/up/down with SiLU, as the decoders'
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<LayerScale> self_attn_layer_scale_, mlp_layer_scale_;
};

// Qwen3OmniMoeCausalConvNet: a Conv1d ("conv") padded on the left by kernel - stride (and on the
// right up to a whole last stride), so output frame t sees inputs <= t.
class CausalConv : public torch::nn::Module {
 public:
  CausalConv(int64_t in, int64_t out, int64_t kernel, at::ScalarType dtype, int64_t dilation = 1,
             int64_t stride = 1, int64_t groups = 1)
      : torch::nn::Module("CausalConv"),
        stride_(stride),
        dilation_(dilation),
        groups_(groups),
        effective_kernel_((kernel - 1) * dilation + 1),
        padding_(effective_kernel_ - stride) {
    conv_ = register_module(
        "conv",
        std::make_shared<ConvWeights>(std::vector<int64_t>{out, in / groups, kernel}, out, dtype));
  }

  at::Tensor forward(const at::Tensor& x) const {
    const int64_t length = x.size(-1);
    // As the reference computes it (in floating point).
    const double n_frames =
        static_cast<double>(length - effective_kernel_ + padding_) / static_cast<double>(stride_) +
        1.0;
    const int64_t ideal =
        (static_cast<int64_t>(std::ceil(n_frames)) - 1) * stride_ + (effective_kernel_ - padding_);
    const int64_t extra = ideal - length;
    // Stride 1 pads on the left only (extra is 0): few channels on the CPU take one pass.
    if (stride_ == 1 && extra == 0 &&
        few_channel_conv_applies(x, conv_->weight, conv_->bias, stride_, groups_)) {
      return few_channel_causal_conv(x, conv_->weight, conv_->bias, dilation_);
    }
    auto padded = at::constant_pad_nd(x, {padding_, extra}, 0);
    const int64_t no_padding = 0;
    return at::conv1d(padded, conv_->weight, conv_->bias, at::IntArrayRef(stride_),
                      at::IntArrayRef(no_padding), at::IntArrayRef(dilation_), groups_)
        .contiguous();
  }

 private:
  int64_t stride_, dilation_, groups_, effective_kernel_, padding_;
  std::shared_ptr<ConvWeights> conv_;
};

// Qwen3OmniMoeCausalTransConvNet: a ConvTranspose1d ("conv") with kernel - stride samples
// trimmed on both sides.
class CausalTransConv : public torch::nn::Module {
 public:
  CausalTransConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, at::ScalarType dtype)
      : torch::nn::Module("CausalTransConv"), stride_(stride), trim_(kernel - stride) {
    conv_ = register_module(
        "conv", std::make_shared<ConvWeights>(std::vector<int64_t>{in, out, kernel}, out, dtype));
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (few_channel_transposed_conv_applies(x, conv_->weight, conv_->bias, stride_)) {
      return few_channel_trimmed_transposed_conv(x, conv_->weight, conv_->bias, stride_);
    }
    auto y = at::conv_transpose1d(x, conv_->weight, conv_->bias, at::IntArrayRef(stride_));
    const int64_t keep = std::max<int64_t>(0, y.size(-1) - 2 * trim_);
    return y.narrow(-1, std::min(trim_, y.size(-1)), keep).contiguous();
  }

 private:
  int64_t stride_, trim_;
  std::shared_ptr<ConvWeights> conv_;
};

// Qwen3OmniMoeConvNeXtBlock: depthwise causal conv, LayerNorm, MLP (GELU), gamma, residual.
class ConvNeXtBlock : public torch::nn::Module {
 public:
  ConvNeXtBlock(int64_t dim, at::ScalarType dtype) : torch::nn::Module("ConvNeXtBlock") {
    dwconv_ = register_module(
        "dwconv", std::make_shared<CausalConv>(dim, dim, 7, dtype, 1, 1, /*groups=*/dim));
    norm_ = register_module("norm", std::make_shared<LayerNorm>(dim, dtype, 1e-6));
    pwconv1_ = register_module("pwconv1", std::make_shared<Linear>(dim, 4 * dim, dtype, true));
    pwconv2_ = register_module("pwconv2", std::make_shared<Linear>(4 * dim, dim, dtype, true));
    gamma_ = register_parameter("gamma", uninitialized({dim}, dtype), false);
  }

  at::Tensor forward(const at::Tensor& x) {
    auto h = dwconv_->forward(x).permute({0, 2, 1});
    h = pwconv2_->forward(at::gelu(pwconv1_->forward(norm_->forward(h))));
    return x + (gamma_ * h).permute({0, 2, 1});
  }

 private:
  std::shared_ptr<CausalConv> dwconv_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> pwconv1_, pwconv2_;
  at::Tensor gamma_;
};

// Qwen3OmniMoeSnakeBeta: x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2 per channel.
class SnakeBeta : public torch::nn::Module {
 public:
  SnakeBeta(int64_t channels, at::ScalarType dtype) : torch::nn::Module("SnakeBeta") {
    alpha_ = register_parameter("alpha", uninitialized({channels}, dtype), false);
    beta_ = register_parameter("beta", uninitialized({channels}, dtype), false);
  }

  at::Tensor forward(const at::Tensor& x) const {
    return snake_beta(x, at::exp(alpha_), at::reciprocal(at::exp(beta_) + 1e-9));
  }

 private:
  at::Tensor alpha_, beta_;
};

namespace {

// Qwen3OmniMoeCode2WavDecoderResidualUnit.
class ResidualUnit : public torch::nn::Module {
 public:
  ResidualUnit(int64_t dim, int64_t dilation, at::ScalarType dtype)
      : torch::nn::Module("ResidualUnit") {
    act1_ = register_module("act1", std::make_shared<SnakeBeta>(dim, dtype));
    conv1_ = register_module("conv1", std::make_shared<CausalConv>(dim, dim, 7, dtype, dilation));
    act2_ = register_module("act2", std::make_shared<SnakeBeta>(dim, dtype));
    conv2_ = register_module("conv2", std::make_shared<CausalConv>(dim, dim, 1, dtype));
  }
  // The residual added into the block's own fresh output: the same sums, without a third
  // tensor as long as the input (a fresh one faults its pages in again on every window).
  at::Tensor forward(const at::Tensor& x) {
    return conv2_->forward(act2_->forward(conv1_->forward(act1_->forward(x)))).add_(x);
  }

 private:
  std::shared_ptr<SnakeBeta> act1_, act2_;
  std::shared_ptr<CausalConv> conv1_, conv2_;
};

}  // namespace

// Qwen3OmniMoeCode2WavDecoderBlock: "block" = [SnakeBeta, causal transposed conv (upsampling
// by the rate), residual units with dilations 1, 3, 9].
class Code2WavDecoderBlock : public torch::nn::Module {
 public:
  Code2WavDecoderBlock(const Code2WavConfig& cfg, int64_t index, at::ScalarType dtype)
      : torch::nn::Module("Code2WavDecoderBlock") {
    const int64_t in_dim = cfg.decoder_dim >> index, out_dim = cfg.decoder_dim >> (index + 1);
    const int64_t rate = cfg.upsample_rates[index];
    auto block = register_module("block", std::make_shared<torch::nn::Module>("Block"));
    act_ = block->register_module("0", std::make_shared<SnakeBeta>(in_dim, dtype));
    upsample_ = block->register_module(
        "1", std::make_shared<CausalTransConv>(in_dim, out_dim, 2 * rate, rate, dtype));
    int64_t i = 2;
    for (int64_t dilation : {1, 3, 9}) {
      units_.push_back(block->register_module(
          std::to_string(i++), std::make_shared<ResidualUnit>(out_dim, dilation, dtype)));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    auto h = upsample_->forward(act_->forward(x));
    for (auto& unit : units_) h = unit->forward(h);
    return h;
  }

 private:
  std::shared_ptr<SnakeBeta> act_;
  std::shared_ptr<CausalTransConv> upsample_;
  std::vector<std::shared_ptr<ResidualUnit>> units_;
};

// ---------------------------------------------------------------------------- Code2Wav

Code2Wav::Code2Wav(const Code2WavConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("Code2Wav"), cfg_(cfg) {
  pre_transformer_ = register_module(
      "pre_transformer", std::make_shared<torch::nn::Module>("Code2WavTransformerModel"));
  auto layers =
      pre_transformer_->register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers_.push_back(layers->register_module(
        std::to_string(i), std::make_shared<Code2WavTransformerLayer>(cfg, dtype)));
  }
  norm_ = pre_transformer_->register_module(
      "norm", std::make_shared<RMSNorm>(cfg.hidden_size, dtype, cfg.rms_norm_eps));
  code_embedding_ = register_module(
      "code_embedding",
      std::make_shared<Embedding>(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size, dtype));

  auto upsample = register_module("upsample", std::make_shared<torch::nn::Module>("Upsample"));
  for (size_t i = 0; i < cfg.upsampling_ratios.size(); ++i) {
    const int64_t factor = cfg.upsampling_ratios[i];
    auto stage =
        upsample->register_module(std::to_string(i), std::make_shared<torch::nn::Module>("Stage"));
    upsample_convs_.push_back(
        stage->register_module("0", std::make_shared<CausalTransConv>(
                                        cfg.hidden_size, cfg.hidden_size, factor, factor, dtype)));
    upsample_blocks_.push_back(
        stage->register_module("1", std::make_shared<ConvNeXtBlock>(cfg.hidden_size, dtype)));
  }

  auto decoder = register_module("decoder", std::make_shared<torch::nn::Module>("Decoder"));
  decoder_in_ = decoder->register_module(
      "0", std::make_shared<CausalConv>(cfg.hidden_size, cfg.decoder_dim, 7, dtype));
  const auto blocks = static_cast<int64_t>(cfg.upsample_rates.size());
  for (int64_t i = 0; i < blocks; ++i) {
    decoder_blocks_.push_back(decoder->register_module(
        std::to_string(i + 1), std::make_shared<Code2WavDecoderBlock>(cfg, i, dtype)));
  }
  const int64_t output_dim = cfg.decoder_dim >> blocks;
  decoder_act_ = decoder->register_module(std::to_string(blocks + 1),
                                          std::make_shared<SnakeBeta>(output_dim, dtype));
  decoder_out_ = decoder->register_module(std::to_string(blocks + 2),
                                          std::make_shared<CausalConv>(output_dim, 1, 7, dtype));
}

at::Tensor Code2Wav::forward(const at::Tensor& codes) {
  validate_codes(cfg_, codes);
  return forward_validated(codes);
}

at::Tensor Code2Wav::forward_validated(const at::Tensor& codes) {
  OMNI_CHECK((codes.dim() == 2 || codes.dim() == 3) && codes.size(-2) == cfg_.num_quantizers,
             "code2wav: codes must be [", cfg_.num_quantizers, ", T] or [B, ", cfg_.num_quantizers,
             ", T], got ", shape_of(codes));
  OMNI_CHECK(codes.size(-1) >= 1, "code2wav: codes must hold at least one frame, got ",
             shape_of(codes));
  return invoke("forward", {codes},
                [this](HookArgs& a) -> c10::IValue { return forward_impl(a[0].toTensor()); })
      .toTensor();
}

at::Tensor Code2Wav::forward_impl(const at::Tensor& codes) {
  const auto& table = code_embedding_->weight;
  const auto device = table.device();
  const auto dtype = table.scalar_type();
  const auto long_opts = at::TensorOptions(at::kLong).device(device);
  const int64_t frames = codes.size(-1);

  // [B, Q, T] + q * codebook_size, embedded and averaged over the quantizers: [B, T, hidden].
  const auto offsets =
      (at::arange(cfg_.num_quantizers, long_opts) * cfg_.codebook_size).view({1, -1, 1});
  const auto batched = codes.dim() == 3 ? codes : codes.unsqueeze(0);
  const auto ids = batched.to(device, at::kLong) + offsets;
  auto hidden = code_embedding_->forward(ids).mean(1);

  // Standard rope over frame positions 0..T-1.
  const auto [cos, sin] =
      rope_cos_sin(cfg_.rope_theta, cfg_.head_dim, at::arange(frames, long_opts), dtype);

  // Causal sliding window: query q sees keys q - window < k <= q.
  const auto q = at::arange(frames, long_opts).unsqueeze(1);
  const auto k = at::arange(frames, long_opts).unsqueeze(0);
  const auto blocked = (k > q).logical_or_(k <= q - cfg_.sliding_window);

  for (auto& layer : layers_) hidden = layer->forward(hidden, cos, sin, blocked);
  hidden = norm_->forward(hidden).permute({0, 2, 1});  // [B, hidden, T]

  for (size_t i = 0; i < upsample_convs_.size(); ++i) {
    hidden = upsample_convs_[i]->forward(hidden);
    hidden = upsample_blocks_[i]->forward(hidden);
  }
  auto wav = decoder_in_->forward(hidden);
  for (auto& block : decoder_blocks_) wav = block->forward(wav);
  wav = decoder_out_->forward(decoder_act_->forward(wav));
  return wav.clamp(-1, 1);
}

// ---------------------------------------------------------------------------- chunked decode

at::Tensor chunked_decode(Code2Wav& model, const at::Tensor& codes, int64_t chunk_size,
                          int64_t left_context) {
  OMNI_CHECK(chunk_size >= 1, "chunked_decode: chunk_size must be >= 1, got ", chunk_size);
  OMNI_CHECK(left_context >= 0, "chunked_decode: left_context must be >= 0, got ", left_context);
  validate_codes(model.config(), codes);
  const int64_t frames = codes.size(1);
  const int64_t spf = model.samples_per_frame();
  std::vector<at::Tensor> wavs;
  for (int64_t start = 0; start < frames;) {
    const int64_t end = std::min(start + chunk_size, frames);
    const int64_t context = std::min(left_context, start);
    // Checked once above for the whole input.
    auto wav = model.forward_validated(codes.narrow(1, start - context, end - start + context));
    const int64_t drop = std::min(context * spf, wav.size(-1));
    wavs.push_back(wav.narrow(-1, drop, wav.size(-1) - drop));
    start = end;
  }
  if (wavs.empty()) return at::empty({0}, at::TensorOptions(at::kFloat));
  return at::cat(wavs, -1).reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
}

}  // namespace omni::models::qwen3_omni
