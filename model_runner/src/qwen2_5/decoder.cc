#include "model_runner/qwen2_5/decoder.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

#include "cpu_offload/check.h"
#include "diffusion/module_tree.h"
#include "model_runner/qwen2_5/mrope.h"
#include "text_decoder_ops.h"

namespace omni::models::qwen2_5 {
namespace {

double lowest_value(at::ScalarType dtype) {
  double lowest = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "qwen2_5_lowest", [&] {
    lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
  });
  return lowest;
}

}  // namespace

at::Tensor causal_attention_mask(const at::Tensor& attention_mask, int64_t batch, int64_t length,
                                 at::ScalarType dtype, const at::Device& device) {
  const auto positions = at::arange(length, at::TensorOptions(at::kLong).device(device));
  // [L, L]: key j lies after query i.
  auto hidden = (positions.unsqueeze(0) > positions.unsqueeze(1)).view({1, 1, length, length});
  if (attention_mask.defined()) {
    OMNI_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == batch &&
                   attention_mask.size(1) == length,
               "attention_mask must be [", batch, ", ", length, "], got ", attention_mask.sizes());
    const auto padding = attention_mask.to(device).eq(0).view({batch, 1, 1, length});
    hidden = at::logical_or(hidden, padding);
  } else {
    hidden = hidden.expand({batch, 1, length, length});
  }
  return at::zeros({batch, 1, length, length}, at::TensorOptions(dtype).device(device))
      .masked_fill_(hidden, lowest_value(dtype));
}

TextAttention::TextAttention(const TextConfig& c, at::ScalarType dtype)
    : torch::nn::Module("TextAttention"),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim) {
  q_proj_ = child<Linear>(*this, "q_proj", c.hidden_size, heads_ * head_dim_, dtype, true);
  k_proj_ = child<Linear>(*this, "k_proj", c.hidden_size, kv_heads_ * head_dim_, dtype, true);
  v_proj_ = child<Linear>(*this, "v_proj", c.hidden_size, kv_heads_ * head_dim_, dtype, true);
  o_proj_ = child<Linear>(*this, "o_proj", heads_ * head_dim_, c.hidden_size, dtype, false);
}

at::Tensor TextAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const at::Tensor& mask) const {
  const int64_t batch = x.size(0), length = x.size(1);
  auto heads = [&](const at::Tensor& t, int64_t n) {
    return t.view({batch, length, n, head_dim_}).transpose(1, 2);
  };
  // cos / sin [B, L, d] broadcast over the heads.
  const auto c = cos.unsqueeze(1);
  const auto s = sin.unsqueeze(1);
  const auto q = apply_rotary(heads(q_proj_->forward(x), heads_), c, s);
  const auto k = apply_rotary(heads(k_proj_->forward(x), kv_heads_), c, s);
  const auto v = heads(v_proj_->forward(x), kv_heads_);
  const int64_t n_rep = heads_ / kv_heads_;
  const double scaling = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  const auto out = at::scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep),
                                                    mask, 0.0, false, scaling);
  return o_proj_->forward(out.transpose(1, 2).reshape({batch, length, heads_ * head_dim_}));
}

TextMlp::TextMlp(const TextConfig& c, at::ScalarType dtype) : torch::nn::Module("TextMlp") {
  gate_proj_ = child<Linear>(*this, "gate_proj", c.hidden_size, c.intermediate_size, dtype, false);
  up_proj_ = child<Linear>(*this, "up_proj", c.hidden_size, c.intermediate_size, dtype, false);
  down_proj_ = child<Linear>(*this, "down_proj", c.intermediate_size, c.hidden_size, dtype, false);
}

at::Tensor TextMlp::forward(const at::Tensor& x) const {
  return down_proj_->forward(at::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
}

DecoderLayer::DecoderLayer(const TextConfig& c, at::ScalarType dtype)
    : HookableModule("DecoderLayer") {
  self_attn_ = child<TextAttention>(*this, "self_attn", c, dtype);
  mlp_ = child<TextMlp>(*this, "mlp", c, dtype);
  input_layernorm_ = child<RMSNorm>(*this, "input_layernorm", c.hidden_size, dtype, c.rms_norm_eps);
  post_attention_layernorm_ =
      child<RMSNorm>(*this, "post_attention_layernorm", c.hidden_size, dtype, c.rms_norm_eps);
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                 const at::Tensor& sin, const at::Tensor& mask) {
  return invoke("forward", {hidden, cos, sin, mask},
                [this](offload::HookArgs& a) -> c10::IValue {
                  const auto& h = a[0].toTensor();
                  const auto x =
                      h + self_attn_->forward(input_layernorm_->forward(h), a[1].toTensor(),
                                              a[2].toTensor(), a[3].toTensor());
                  return x + mlp_->forward(post_attention_layernorm_->forward(x));
                })
      .toTensor();
}

TextDecoder::TextDecoder(const TextConfig& c, at::ScalarType dtype)
    : HookableModule("TextDecoder", {"forward", "embed"}), config_(c), dtype_(dtype) {
  embed_tokens_ = child<Embedding>(*this, "embed_tokens", c.vocab_size, c.hidden_size, dtype);
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_->push_back(std::make_shared<DecoderLayer>(c, dtype));
  }
  norm_ = child<RMSNorm>(*this, "norm", c.hidden_size, dtype, c.rms_norm_eps);
}

DecoderLayer& TextDecoder::layer(int64_t i) {
  OMNI_CHECK(i >= 0 && i < num_layers(), "decoder layer ", i, " out of range (", num_layers(),
             " layers)");
  return *layers_->ptr<DecoderLayer>(static_cast<size_t>(i));
}

at::Tensor TextDecoder::embed(const at::Tensor& input_ids) {
  return invoke("embed", {input_ids},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return embed_tokens_->forward(a[0].toTensor());
                })
      .toTensor();
}

// An undefined mask or position tensor travels through the hooks as None.
at::Tensor TextDecoder::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                const at::Tensor& position_ids) {
  OMNI_CHECK(input_ids.dim() == 2, "the Qwen2.5 decoder takes input_ids [batch, length], got ",
             input_ids.sizes());
  return invoke("forward", {input_ids, attention_mask, position_ids},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return run_layers(embed_tokens_->forward(a[0].toTensor()),
                                    a[1].isNone() ? at::Tensor() : a[1].toTensor(),
                                    a[2].isNone() ? at::Tensor() : a[2].toTensor());
                })
      .toTensor();
}

at::Tensor TextDecoder::forward_embeds(const at::Tensor& inputs_embeds,
                                       const at::Tensor& attention_mask,
                                       const at::Tensor& position_ids) {
  OMNI_CHECK(inputs_embeds.dim() == 3 && inputs_embeds.size(2) == config_.hidden_size,
             "the Qwen2.5 decoder takes inputs_embeds [batch, length, ", config_.hidden_size,
             "], got ", inputs_embeds.sizes());
  return invoke("forward", {inputs_embeds, attention_mask, position_ids},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return run_layers(a[0].toTensor(), a[1].isNone() ? at::Tensor() : a[1].toTensor(),
                                    a[2].isNone() ? at::Tensor() : a[2].toTensor());
                })
      .toTensor();
}

at::Tensor TextDecoder::run_layers(const at::Tensor& inputs_embeds,
                                   const at::Tensor& attention_mask,
                                   const at::Tensor& position_ids) {
  const int64_t batch = inputs_embeds.size(0), length = inputs_embeds.size(1);
  const auto device = inputs_embeds.device();
  const auto positions =
      position_ids.defined() ? position_ids.to(device) : text_position_ids(batch, length, device);
  OMNI_CHECK(positions.dim() == 3 && positions.size(0) == 3 && positions.size(1) == batch &&
                 positions.size(2) == length,
             "position_ids must be [3, ", batch, ", ", length, "], got ", positions.sizes());
  const auto dtype = inputs_embeds.scalar_type();
  const auto [cos, sin] = mrope_cos_sin(config_, positions, dtype);
  const auto mask = causal_attention_mask(attention_mask, batch, length, dtype, device);
  at::Tensor hidden = inputs_embeds;
  for (int64_t i = 0; i < num_layers(); ++i) hidden = layer(i).forward(hidden, cos, sin, mask);
  return norm_->forward(hidden);
}

}  // namespace omni::models::qwen2_5
