#include "model_runner/diffusion/umt5_encoder.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

#include "cpu_offload/check.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"
#include "module_tree.h"

namespace omni::models {
namespace {

// transformers' NewGELUActivation ("gelu_new"), written as it is there so that the float
// rounding matches: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).
at::Tensor gelu_new(const at::Tensor& x) {
  constexpr double kPi = 3.14159265358979323846;
  const double c = std::sqrt(2.0 / kPi);
  return 0.5 * x * (1.0 + at::tanh(c * (x + 0.044715 * at::pow(x, 3.0))));
}

// UMT5Block clamps fp16 activations so that an overflow stays finite.
at::Tensor clamp_fp16(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  const double max = static_cast<double>(std::numeric_limits<c10::Half>::max());
  const bool has_inf = at::isinf(x).any().item<bool>();
  const double clamp = has_inf ? max - 1000.0 : max;
  return at::clamp(x, -clamp, clamp);
}

double lowest_value(at::ScalarType dtype) {
  double lowest = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "umt5_lowest", [&] {
    lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
  });
  return lowest;
}

}  // namespace

UMT5Config UMT5Config::parse(const HfConfig& json) {
  auto reject = [&](const std::string& field, const std::string& value, const char* why) {
    OMNI_THROW(json.source(), ": field '",
               json.prefix().empty() ? field : json.prefix() + "." + field, "' is ", value,
               ", but the UMT5 encoder supports only ", why);
  };
  const std::string proj = json.get_string("feed_forward_proj", std::string("relu"));
  if (proj != "gated-gelu") {
    reject("feed_forward_proj", "'" + proj + "'", "'gated-gelu' (gelu_new, as UMT5 / Wan use)");
  }
  if (json.has("dense_act_fn")) {
    const std::string act = json.get_string("dense_act_fn");
    if (act != "gelu_new") reject("dense_act_fn", "'" + act + "'", "'gelu_new'");
  }
  if (json.has("is_gated_act") && !json.get_bool("is_gated_act")) {
    reject("is_gated_act", "false", "a gated feed-forward (true)");
  }
  if (json.get_bool("is_decoder", false)) {
    reject("is_decoder", "true", "the encoder (false)");
  }

  UMT5Config c;
  c.vocab_size = json.get_int("vocab_size");
  c.d_model = json.get_int("d_model");
  c.d_kv = json.get_int("d_kv");
  c.num_heads = json.get_int("num_heads");
  c.d_ff = json.get_int("d_ff");
  c.num_layers = json.get_int("num_layers");
  c.relative_attention_num_buckets = json.get_int("relative_attention_num_buckets", 32);
  c.relative_attention_max_distance = json.get_int("relative_attention_max_distance", 128);
  c.layer_norm_epsilon = json.get_double("layer_norm_epsilon", 1e-6);
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size},
      {"d_model", c.d_model},
      {"d_kv", c.d_kv},
      {"num_heads", c.num_heads},
      {"d_ff", c.d_ff},
      {"num_layers", c.num_layers},
      {"relative_attention_max_distance", c.relative_attention_max_distance}};
  for (const auto& [field, value] : positive) {
    if (value < 1) reject(field, std::to_string(value), "a positive value");
  }
  // Bidirectional: half the buckets per direction, half of those exact, the rest logarithmic.
  if (c.relative_attention_num_buckets < 4) {
    reject("relative_attention_num_buckets", std::to_string(c.relative_attention_num_buckets),
           "at least 4");
  }
  return c;
}

at::Tensor umt5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                          int64_t num_buckets, int64_t max_distance,
                                          const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const auto context = at::arange(query_length, opts).unsqueeze(1);
  const auto memory = at::arange(key_length, opts).unsqueeze(0);
  auto relative = memory - context;  // [Lq, Lk]
  // As transformers' UMT5Attention._relative_position_bucket with is_decoder false.
  const int64_t half = num_buckets / 2;
  auto buckets = relative.gt(0).to(at::kLong) * half;
  relative = at::abs(relative);
  const int64_t max_exact = half / 2;
  const auto is_small = relative.lt(max_exact);
  auto log_ratio = at::log(relative.to(at::kFloat) / max_exact) /
                   std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact));
  log_ratio = log_ratio * (half - max_exact);
  auto if_large = max_exact + log_ratio.to(at::kLong);
  if_large = at::minimum(if_large, at::full_like(if_large, half - 1));
  return buckets + at::where(is_small, relative, if_large);
}

UMT5Attention::UMT5Attention(const UMT5Config& c, at::ScalarType dtype)
    : torch::nn::Module("UMT5Attention"), heads_(c.num_heads), d_kv_(c.d_kv) {
  const int64_t inner = c.num_heads * c.d_kv;
  q_ = child<Linear>(*this, "q", c.d_model, inner, dtype, false);
  k_ = child<Linear>(*this, "k", c.d_model, inner, dtype, false);
  v_ = child<Linear>(*this, "v", c.d_model, inner, dtype, false);
  o_ = child<Linear>(*this, "o", inner, c.d_model, dtype, false);
  relative_attention_bias_ = child<Embedding>(*this, "relative_attention_bias",
                                              c.relative_attention_num_buckets, c.num_heads, dtype);
}

at::Tensor UMT5Attention::forward(const at::Tensor& x, const at::Tensor& buckets,
                                  const at::Tensor& mask) const {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, length, heads_, d_kv_}).transpose(1, 2);
  };
  const auto q = heads(q_->forward(x));
  const auto k = heads(k_->forward(x));
  const auto v = heads(v_->forward(x));
  // [Lq, Lk, heads] -> [1, heads, Lq, Lk]
  const auto position_bias =
      relative_attention_bias_->forward(buckets).permute({2, 0, 1}).unsqueeze(0);
  // No 1/sqrt(d_kv): T5 folds it into the initialization of q.
  auto scores = at::matmul(q, k.transpose(2, 3));
  scores = scores + position_bias;
  scores = scores + mask;
  const auto probs = at::softmax(scores, -1);
  const auto out = at::matmul(probs, v).transpose(1, 2).reshape({batch, length, heads_ * d_kv_});
  return o_->forward(out);
}

UMT5LayerSelfAttention::UMT5LayerSelfAttention(const UMT5Config& c, at::ScalarType dtype)
    : torch::nn::Module("UMT5LayerSelfAttention") {
  attention_ = child<UMT5Attention>(*this, "SelfAttention", c, dtype);
  layer_norm_ = child<RMSNorm>(*this, "layer_norm", c.d_model, dtype, c.layer_norm_epsilon);
}

at::Tensor UMT5LayerSelfAttention::forward(const at::Tensor& x, const at::Tensor& buckets,
                                           const at::Tensor& mask) const {
  return x + attention_->forward(layer_norm_->forward(x), buckets, mask);
}

UMT5LayerFF::UMT5LayerFF(const UMT5Config& c, at::ScalarType dtype)
    : torch::nn::Module("UMT5LayerFF") {
  dense_ = register_module("DenseReluDense",
                           std::make_shared<torch::nn::Module>("UMT5DenseGatedActDense"));
  wi_0_ = child<Linear>(*dense_, "wi_0", c.d_model, c.d_ff, dtype, false);
  wi_1_ = child<Linear>(*dense_, "wi_1", c.d_model, c.d_ff, dtype, false);
  wo_ = child<Linear>(*dense_, "wo", c.d_ff, c.d_model, dtype, false);
  layer_norm_ = child<RMSNorm>(*this, "layer_norm", c.d_model, dtype, c.layer_norm_epsilon);
}

at::Tensor UMT5LayerFF::forward(const at::Tensor& x) const {
  const auto h = layer_norm_->forward(x);
  auto gated = gelu_new(wi_0_->forward(h)) * wi_1_->forward(h);
  if (gated.scalar_type() != wo_->weight.scalar_type()) gated = gated.to(wo_->weight.scalar_type());
  return x + wo_->forward(gated);
}

UMT5Block::UMT5Block(const UMT5Config& c, at::ScalarType dtype) : HookableModule("UMT5Block") {
  auto layers = register_module("layer", torch::nn::ModuleList());
  self_attention_ = std::make_shared<UMT5LayerSelfAttention>(c, dtype);
  ff_ = std::make_shared<UMT5LayerFF>(c, dtype);
  layers->push_back(self_attention_);
  layers->push_back(ff_);
}

at::Tensor UMT5Block::forward(const at::Tensor& x, const at::Tensor& buckets,
                              const at::Tensor& mask) {
  return invoke("forward", {x, buckets, mask},
                [this](offload::HookArgs& a) -> c10::IValue {
                  auto h = clamp_fp16(
                      self_attention_->forward(a[0].toTensor(), a[1].toTensor(), a[2].toTensor()));
                  return clamp_fp16(ff_->forward(h));
                })
      .toTensor();
}

UMT5Encoder::UMT5Encoder(const UMT5Config& c, at::ScalarType dtype)
    : HookableModule("UMT5EncoderModel"), config_(c), dtype_(dtype) {
  shared_ = child<Embedding>(*this, "shared", c.vocab_size, c.d_model, dtype);
  encoder_ = register_module("encoder", std::make_shared<torch::nn::Module>("UMT5Stack"));
  blocks_ = encoder_->register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks_->push_back(std::make_shared<UMT5Block>(c, dtype));
  final_layer_norm_ =
      child<RMSNorm>(*encoder_, "final_layer_norm", c.d_model, dtype, c.layer_norm_epsilon);
}

UMT5Block& UMT5Encoder::block(int64_t i) {
  OMNI_CHECK(i >= 0 && i < num_blocks(), "UMT5 block ", i, " out of range (", num_blocks(),
             " blocks)");
  return *blocks_->ptr<UMT5Block>(static_cast<size_t>(i));
}

at::Tensor UMT5Encoder::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  return invoke("forward", {input_ids, attention_mask},
                [this](offload::HookArgs& a) -> c10::IValue {
                  // An undefined mask travels as None.
                  return forward_impl(a[0].toTensor(),
                                      a[1].isNone() ? at::Tensor() : a[1].toTensor());
                })
      .toTensor();
}

at::Tensor UMT5Encoder::forward_impl(const at::Tensor& input_ids,
                                     const at::Tensor& attention_mask) {
  OMNI_CHECK(input_ids.dim() == 2, "UMT5Encoder: input_ids must be [batch, length], got ",
             input_ids.sizes());
  const int64_t batch = input_ids.size(0);
  const int64_t length = input_ids.size(1);
  auto x = shared_->forward(input_ids);
  // Additive mask over the keys: 0 on tokens, the dtype's lowest value on padding (as
  // transformers' bidirectional mask for eager attention).
  auto mask = at::zeros({batch, 1, 1, length}, x.options());
  if (attention_mask.defined()) {
    OMNI_CHECK(attention_mask.sizes() == input_ids.sizes(),
               "UMT5Encoder: attention_mask must have the shape of input_ids ", input_ids.sizes(),
               ", got ", attention_mask.sizes());
    const auto padding = attention_mask.to(x.device()).eq(0).view({batch, 1, 1, length});
    mask = mask.masked_fill(padding, lowest_value(x.scalar_type()));
  }
  const auto buckets =
      umt5_relative_position_buckets(length, length, config_.relative_attention_num_buckets,
                                     config_.relative_attention_max_distance, x.device());
  for (int64_t i = 0; i < num_blocks(); ++i) x = block(i).forward(x, buckets, mask);
  return final_layer_norm_->forward(x);
}

std::shared_ptr<UMT5Encoder> load_umt5_encoder(const std::string& dir, at::ScalarType dtype) {
  const auto json = HfConfig::load(dir);
  const auto config = UMT5Config::parse(json);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  const auto resolved = resolve_dtype(dtype, checkpoint, "");
  auto model = std::make_shared<UMT5Encoder>(config, resolved);
  load_weights(*model, checkpoint, "");
  return model;
}

}  // namespace omni::models
