#include "model_runner/qwen3_omni/audio_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

using offload::HookArgs;

namespace {

// Python's floor division (the reference formula relies on (-1) // 2 == -1).
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Stride-2, padding-1 3x3 convolution weights as nn.Conv2d names them (weight, bias).
std::shared_ptr<torch::nn::Module> conv_module(int64_t in, int64_t out, at::ScalarType dtype,
                                               at::Tensor& weight, at::Tensor& bias) {
  auto m = std::make_shared<torch::nn::Module>("Conv2d");
  weight = m->register_parameter("weight", uninitialized({out, in, 3, 3}, dtype), false);
  bias = m->register_parameter("bias", uninitialized({out}, dtype), false);
  return m;
}

// SinusoidsPositionEmbedding: [length, channels] = cat(sin(t * inv), cos(t * inv)), float32,
// with the reference's operation order (the increment in double, the rest in float32).
at::Tensor sinusoids(int64_t length, int64_t channels, double max_timescale = 10000.0) {
  OMNI_CHECK(channels % 2 == 0 && channels >= 4,
             "audio positional embedding needs an even d_model >= 4, got ", channels);
  const int64_t half = channels / 2;
  const double increment = std::log(max_timescale) / static_cast<double>(half - 1);
  auto inv_timescales =
      at::exp(at::arange(channels / 2, at::TensorOptions(at::kLong)).to(at::kFloat) * -increment);
  auto scaled_time =
      at::arange(length, at::TensorOptions(at::kLong)).unsqueeze(1) * inv_timescales.unsqueeze(0);
  return at::cat({at::sin(scaled_time), at::cos(scaled_time)}, 1);
}

}  // namespace

// ---------------------------------------------------------------------------- activations

void check_hf_activation(const std::string& name, const char* field) {
  static const char* kKnown[] = {
      "gelu", "gelu_pytorch_tanh", "gelu_new", "quick_gelu", "silu", "swish", "relu"};
  for (const char* k : kKnown) {
    if (name == k) return;
  }
  OMNI_THROW(field, " '", name,
             "' is not supported (supported: gelu, gelu_pytorch_tanh, gelu_new, quick_gelu, silu, "
             "swish, relu)");
}

at::Tensor hf_activation(const std::string& name, const at::Tensor& x) {
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "gelu_new") {
    // NewGELUActivation, written out as the reference does.
    const double c = std::sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + at::tanh(c * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "relu") return at::relu(x);
  check_hf_activation(name, "activation");
  return x;  // unreachable
}

int64_t audio_output_length(int64_t mel_frames, int64_t n_window) {
  OMNI_CHECK(n_window > 0, "n_window must be positive, got ", n_window);
  OMNI_CHECK(mel_frames >= 0, "mel frame count must not be negative, got ", mel_frames);
  const int64_t chunk = 2 * n_window;
  const int64_t leave = mel_frames % chunk;
  const int64_t feat = floor_div(leave - 1, 2) + 1;
  return floor_div(floor_div(feat - 1, 2) + 1 - 1, 2) + 1 + (mel_frames / chunk) * 13;
}

// ---------------------------------------------------------------------------- layer

AudioEncoderLayer::AudioEncoderLayer(const AudioEncoderConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("AudioEncoderLayer"),
      heads_(cfg.encoder_attention_heads),
      activation_(cfg.activation_function) {
  const int64_t d = cfg.d_model;
  OMNI_CHECK(heads_ > 0 && d % heads_ == 0, "audio d_model ", d,
             " is not divisible by encoder_attention_heads ", heads_);
  check_hf_activation(activation_, "audio_config.activation_function");
  self_attn_ = register_module("self_attn", std::make_shared<torch::nn::Module>("AudioAttention"));
  q_proj_ = self_attn_->register_module("q_proj", std::make_shared<Linear>(d, d, dtype, true));
  k_proj_ = self_attn_->register_module("k_proj", std::make_shared<Linear>(d, d, dtype, true));
  v_proj_ = self_attn_->register_module("v_proj", std::make_shared<Linear>(d, d, dtype, true));
  out_proj_ = self_attn_->register_module("out_proj", std::make_shared<Linear>(d, d, dtype, true));
  // nn.LayerNorm's default eps (1e-5) in the reference.
  self_attn_layer_norm_ =
      register_module("self_attn_layer_norm", std::make_shared<LayerNorm>(d, dtype, 1e-5));
  fc1_ = register_module("fc1", std::make_shared<Linear>(d, cfg.encoder_ffn_dim, dtype, true));
  fc2_ = register_module("fc2", std::make_shared<Linear>(cfg.encoder_ffn_dim, d, dtype, true));
  final_layer_norm_ =
      register_module("final_layer_norm", std::make_shared<LayerNorm>(d, dtype, 1e-5));
}

at::Tensor AudioEncoderLayer::attention(const at::Tensor& x,
                                        const std::vector<int64_t>& cu_seqlens) const {
  const int64_t len = x.size(0);
  const int64_t head_dim = x.size(1) / heads_;
  // [L, d] -> [heads, L, head_dim]
  auto q = q_proj_->forward(x).reshape({len, heads_, head_dim}).transpose(0, 1);
  auto k = k_proj_->forward(x).reshape({len, heads_, head_dim}).transpose(0, 1);
  auto v = v_proj_->forward(x).reshape({len, heads_, head_dim}).transpose(0, 1);
  return out_proj_->forward(segment_attention(q, k, v, cu_seqlens));
}

at::Tensor AudioEncoderLayer::forward(const at::Tensor& hidden,
                                      const std::vector<int64_t>& cu_seqlens) {
  return invoke("forward", {hidden, c10::IValue(cu_seqlens)},
                [this](HookArgs& a) -> c10::IValue {
                  const auto& h = a[0].toTensor();
                  const auto cu = a[1].toIntVector();
                  auto x = h + attention(self_attn_layer_norm_->forward(h), cu);
                  x = x + fc2_->forward(hf_activation(
                              activation_, fc1_->forward(final_layer_norm_->forward(x))));
                  if (x.scalar_type() == at::kHalf) {
                    const double clamp = 65504.0 - 1000.0;  // finfo(float16).max - 1000
                    x = at::clamp(x, -clamp, clamp);
                  }
                  return x;
                })
      .toTensor();
}

// ---------------------------------------------------------------------------- encoder

AudioEncoder::AudioEncoder(const AudioEncoderConfig& cfg, at::ScalarType dtype)
    : offload::HookableModule("AudioEncoder"), cfg_(cfg) {
  OMNI_CHECK(cfg.n_window > 0, "audio_config.n_window must be positive, got ", cfg.n_window);
  OMNI_CHECK(cfg.n_window_infer >= 2 * cfg.n_window, "audio_config.n_window_infer (",
             cfg.n_window_infer, ") must be at least 2 * n_window (", 2 * cfg.n_window, ")");
  OMNI_CHECK(cfg.conv_chunksize > 0, "audio_config.conv_chunksize must be positive");
  check_hf_activation(cfg.activation_function, "audio_config.activation_function");
  const int64_t h = cfg.downsample_hidden_size;
  positional_embedding_ = sinusoids(cfg.max_source_positions, cfg.d_model);
  conv2d1_ = register_module("conv2d1", conv_module(1, h, dtype, conv_weight_[0], conv_bias_[0]));
  conv2d2_ = register_module("conv2d2", conv_module(h, h, dtype, conv_weight_[1], conv_bias_[1]));
  conv2d3_ = register_module("conv2d3", conv_module(h, h, dtype, conv_weight_[2], conv_bias_[2]));
  const int64_t freq = (((cfg.num_mel_bins + 1) / 2 + 1) / 2 + 1) / 2;
  conv_out_ = register_module("conv_out", std::make_shared<Linear>(h * freq, cfg.d_model, dtype,
                                                                   /*bias=*/false));
  layers_holder_ = register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (int64_t i = 0; i < cfg.encoder_layers; ++i) {
    layers_.push_back(layers_holder_->register_module(
        std::to_string(i), std::make_shared<AudioEncoderLayer>(cfg, dtype)));
  }
  ln_post_ = register_module("ln_post", std::make_shared<LayerNorm>(cfg.d_model, dtype, 1e-5));
  proj1_ =
      register_module("proj1", std::make_shared<Linear>(cfg.d_model, cfg.d_model, dtype, true));
  proj2_ =
      register_module("proj2", std::make_shared<Linear>(cfg.d_model, cfg.output_dim, dtype, true));
}

at::Tensor AudioEncoder::forward(const at::Tensor& features, const std::vector<int64_t>& lengths) {
  return invoke("forward", {features, c10::IValue(lengths)},
                [this](HookArgs& a) -> c10::IValue {
                  return forward_impl(a[0].toTensor(), a[1].toIntVector());
                })
      .toTensor();
}

at::Tensor AudioEncoder::forward_impl(const at::Tensor& input,
                                      const std::vector<int64_t>& lengths) {
  OMNI_CHECK(input.dim() == 2 && input.size(0) == cfg_.num_mel_bins,
             "audio features must be [num_mel_bins=", cfg_.num_mel_bins, ", frames], got sizes ",
             input.sizes());
  OMNI_CHECK(!lengths.empty(), "audio encoder needs at least one clip");
  int64_t total = 0;
  for (int64_t len : lengths) {
    OMNI_CHECK(len > 0, "every audio clip needs at least one mel frame, got ", len);
    total += len;
  }
  OMNI_CHECK(total == input.size(1), "audio clip lengths sum to ", total, " mel frames but the ",
             "features have ", input.size(1));

  const auto& weight = conv_weight_[0];
  const auto dtype = weight.scalar_type();
  const auto device = weight.device();
  const at::Tensor features = input.to(device, dtype);

  // chunk_and_pad_features: every clip in chunks of 2 * n_window frames, the last one shorter
  // (or full when the clip is a multiple), all zero-padded to the longest chunk.
  const int64_t chunk = 2 * cfg_.n_window;
  std::vector<int64_t> chunk_lengths;
  for (int64_t len : lengths) {
    const int64_t n = (len + chunk - 1) / chunk;
    for (int64_t c = 0; c < n; ++c) chunk_lengths.push_back(c + 1 < n ? chunk : len - c * chunk);
  }
  const int64_t num_chunks = static_cast<int64_t>(chunk_lengths.size());
  const int64_t max_chunk = *std::max_element(chunk_lengths.begin(), chunk_lengths.end());
  auto padded = at::zeros({num_chunks, cfg_.num_mel_bins, max_chunk}, features.options());
  for (int64_t c = 0, start = 0; c < num_chunks; start += chunk_lengths[c], ++c) {
    padded[c].narrow(1, 0, chunk_lengths[c]).copy_(features.narrow(1, start, chunk_lengths[c]));
  }
  padded = padded.unsqueeze(1);  // [chunks, 1, mel, time]

  // Three stride-2 convolutions with (exact) GELU, conv_chunksize chunks at a time.
  std::vector<at::Tensor> conv_outs;
  for (const auto& part : padded.split(cfg_.conv_chunksize, 0)) {
    auto x = part;
    for (int i = 0; i < 3; ++i) {
      x = at::gelu(at::conv2d(x, conv_weight_[i], conv_bias_[i], /*stride=*/{2, 2},
                              /*padding=*/{1, 1}));
    }
    conv_outs.push_back(x);
  }
  auto embed = conv_outs.size() == 1 ? conv_outs[0] : at::cat(conv_outs, 0);
  const int64_t b = embed.size(0), c = embed.size(1), f = embed.size(2), t = embed.size(3);
  embed = conv_out_->forward(embed.permute({0, 3, 1, 2}).contiguous().view({b, t, c * f}));
  OMNI_CHECK(t <= positional_embedding_.size(0), "audio chunk of ", t,
             " tokens exceeds max_source_positions ", positional_embedding_.size(0));
  embed = embed + positional_embedding_.narrow(0, 0, t).unsqueeze(0).to(device, dtype);

  // get_valid_indices: the first audio_output_length(chunk) rows of every chunk.
  std::vector<int64_t> valid;
  int64_t max_after_cnn = 0;
  for (int64_t i = 0; i < num_chunks; ++i) {
    const int64_t n = audio_output_length(chunk_lengths[i], cfg_.n_window);
    max_after_cnn = std::max(max_after_cnn, n);
    for (int64_t j = 0; j < n; ++j) valid.push_back(i * t + j);
  }
  auto index = at::tensor(valid, at::TensorOptions(at::kLong)).to(device);
  auto hidden = embed.reshape({-1, embed.size(-1)}).index_select(0, index);

  // get_audio_cu_seqlens: windows of max_after_cnn * (n_window_infer / chunk) tokens per clip.
  const int64_t window = max_after_cnn * (cfg_.n_window_infer / chunk);
  std::vector<int64_t> cu_seqlens = {0};
  for (int64_t len : lengths) {
    const int64_t n = audio_output_length(len, cfg_.n_window);
    for (int64_t w = 0; w < n / window; ++w) cu_seqlens.push_back(cu_seqlens.back() + window);
    if (n % window != 0) cu_seqlens.push_back(cu_seqlens.back() + n % window);
  }
  OMNI_CHECK(cu_seqlens.back() == hidden.size(0), "audio windows cover ", cu_seqlens.back(),
             " tokens but the convolutions made ", hidden.size(0));

  for (const auto& layer : layers_) hidden = layer->forward(hidden, cu_seqlens);

  hidden = ln_post_->forward(hidden);
  hidden = hf_activation(cfg_.activation_function, proj1_->forward(hidden));
  return proj2_->forward(hidden);
}

}  // namespace omni::models::qwen3_omni
