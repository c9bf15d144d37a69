#include "model_runner/diffusion/wan_transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"
#include "module_tree.h"

namespace omni::models {
namespace {

// diffusers' FP32LayerNorm: layer norm in float32 (weight and bias too, when given), cast back
// to the input's dtype.
at::Tensor fp32_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           double eps) {
  auto w = weight.defined() ? weight.to(at::kFloat) : at::Tensor();
  auto b = bias.defined() ? bias.to(at::kFloat) : at::Tensor();
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, w, b, eps).to(x.scalar_type());
}

// get_1d_rotary_pos_embed(dim, max_seq_len, use_real, repeat_interleave_real) in float64,
// returned as float32 [max_seq_len, dim] cos and sin.
std::pair<at::Tensor, at::Tensor> rotary_table(int64_t dim, int64_t max_seq_len, double theta) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  auto freqs = 1.0 / at::pow(theta, at::arange(0, dim, 2, opts) / static_cast<double>(dim));
  auto angles = at::outer(at::arange(max_seq_len, opts), freqs);
  return {at::repeat_interleave(at::cos(angles), 2, 1).to(at::kFloat),
          at::repeat_interleave(at::sin(angles), 2, 1).to(at::kFloat)};
}

// WanAttnProcessor's rotation of interleaved pairs: x [B, L, H, d], cos/sin [1, L, 1, d]
// float32; computed in float32, returned in x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  using at::indexing::None;
  using at::indexing::Slice;
  auto x1 = x.index({"...", Slice(0, None, 2)});
  auto x2 = x.index({"...", Slice(1, None, 2)});
  auto c = cos.index({"...", Slice(0, None, 2)});
  auto s = sin.index({"...", Slice(1, None, 2)});
  auto even = x1 * c - x2 * s;
  auto odd = x1 * s + x2 * c;
  return at::stack({even, odd}, -1).flatten(-2).to(x.scalar_type());
}

void check_field(const HfConfig& json, bool ok, const std::string& field, const std::string& value,
                 const std::string& why) {
  OMNI_CHECK(ok, json.source(), ": field '", field, "' = ", value, " is not supported by ",
             "WanTransformer3DModel: ", why);
}

}  // namespace

WanTransformerConfig WanTransformerConfig::from_hf(const HfConfig& json) {
  const std::string cls = json.get_string("_class_name", "WanTransformer3DModel");
  check_field(json, cls == "WanTransformer3DModel", "_class_name", "\"" + cls + "\"",
              "expected \"WanTransformer3DModel\"");
  WanTransformerConfig c;
  const auto patch = json.get_int_list("patch_size", std::vector<int64_t>{1, 2, 2});
  check_field(json, patch.size() == 3 && patch[0] > 0 && patch[1] > 0 && patch[2] > 0, "patch_size",
              nlohmann::json(patch).dump(), "expected 3 positive integers");
  c.patch_t = patch[0];
  c.patch_h = patch[1];
  c.patch_w = patch[2];
  auto positive = [&json](const char* field, int64_t fallback) {
    const int64_t v = json.get_int(field, fallback);
    check_field(json, v > 0, field, std::to_string(v), "must be positive");
    return v;
  };
  c.num_heads = positive("num_attention_heads", 40);
  c.head_dim = positive("attention_head_dim", 128);
  c.in_channels = positive("in_channels", 16);
  c.out_channels = json.has("out_channels") ? positive("out_channels", 16) : c.in_channels;
  c.text_dim = positive("text_dim", 4096);
  c.freq_dim = positive("freq_dim", 256);
  c.ffn_dim = positive("ffn_dim", 13824);
  c.num_layers = positive("num_layers", 40);
  c.rope_max_seq_len = positive("rope_max_seq_len", 1024);
  c.cross_attn_norm = json.get_bool("cross_attn_norm", true);
  c.eps = json.get_double("eps", 1e-6);
  check_field(json, c.eps > 0, "eps", std::to_string(c.eps), "must be positive");
  // The rotary embedding gives 2*(d/6) channels to each of height and width, the rest to
  // frames; each part must be even.
  const int64_t hw = 2 * (c.head_dim / 6);
  check_field(json, c.head_dim % 2 == 0 && hw > 0, "attention_head_dim", std::to_string(c.head_dim),
              "the 3-D rotary embedding needs an even size >= 6");
  // diffusers builds the q/k RMS norm across heads whatever this says; accept only the value
  // the Wan checkpoints carry, so a config that means something else fails loudly.
  const std::string qk = json.get_string("qk_norm", "rms_norm_across_heads");
  check_field(json, qk == "rms_norm_across_heads", "qk_norm", "\"" + qk + "\"",
              "expected \"rms_norm_across_heads\"");
  for (const char* field : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"}) {
    check_field(json, !json.has(field), field, json.has(field) ? json.raw()[field].dump() : "",
                "image conditioning (I2V's image embedder) is not implemented; expected null");
  }
  return c;
}

WanTransformerConfig WanTransformerConfig::load(const std::string& path) {
  return from_hf(HfConfig::load(path));
}

WanRMSNorm::WanRMSNorm(int64_t dim, at::ScalarType dtype, double eps_value)
    : torch::nn::Module("WanRMSNorm"), eps(eps_value) {
  weight = register_parameter("weight", uninitialized({dim}, dtype), false);
}

at::Tensor WanRMSNorm::forward(const at::Tensor& x) const {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

WanAttention::WanAttention(const WanTransformerConfig& c, at::ScalarType dtype)
    : HookableModule("WanAttention"), heads_(c.num_heads) {
  const int64_t d = c.inner_dim();
  to_q_ = child<Linear>(*this, "to_q", d, d, dtype, true);
  to_k_ = child<Linear>(*this, "to_k", d, d, dtype, true);
  to_v_ = child<Linear>(*this, "to_v", d, d, dtype, true);
  to_out_ = child<Linear>(*group(*this, "to_out"), "0", d, d, dtype, true);
  norm_q_ = child<WanRMSNorm>(*this, "norm_q", d, dtype, c.eps);
  norm_k_ = child<WanRMSNorm>(*this, "norm_k", d, dtype, c.eps);
}

at::Tensor WanAttention::forward(const at::Tensor& x, const at::Tensor& context,
                                 const at::Tensor& rope_cos, const at::Tensor& rope_sin) {
  return invoke("forward", {x, context, rope_cos, rope_sin},
                [this](offload::HookArgs& a) -> c10::IValue {
                  const at::Tensor h = a[0].toTensor();
                  const at::Tensor ctx = a[1].toTensor();
                  const at::Tensor cos = a[2].toTensor();
                  const at::Tensor sin = a[3].toTensor();
                  const at::Tensor& kv_in = ctx.defined() ? ctx : h;
                  auto q = norm_q_->forward(to_q_->forward(h));
                  auto k = norm_k_->forward(to_k_->forward(kv_in));
                  auto v = to_v_->forward(kv_in);
                  q = q.unflatten(2, {heads_, -1});  // [B, L, H, d]
                  k = k.unflatten(2, {heads_, -1});
                  v = v.unflatten(2, {heads_, -1});
                  if (cos.defined()) {
                    q = apply_rotary(q, cos, sin);
                    k = apply_rotary(k, cos, sin);
                  }
                  auto o = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                            v.transpose(1, 2));
                  o = o.transpose(1, 2).flatten(2, 3).to(q.scalar_type());
                  return to_out_->forward(o);
                })
      .toTensor();
}

WanTransformerBlock::WanTransformerBlock(const WanTransformerConfig& c, at::ScalarType dtype)
    : HookableModule("WanTransformerBlock", {"forward", "forward_passes"}),
      eps_(c.eps),
      cross_attn_norm_(c.cross_attn_norm) {
  const int64_t d = c.inner_dim();
  attn1_ = child<WanAttention>(*this, "attn1", c, dtype);
  attn2_ = child<WanAttention>(*this, "attn2", c, dtype);
  if (cross_attn_norm_) {
    auto norm2 = group(*this, "norm2");  // kept in float32, as diffusers does
    norm2_weight_ = norm2->register_parameter("weight", uninitialized({d}, at::kFloat), false);
    norm2_bias_ = norm2->register_parameter("bias", uninitialized({d}, at::kFloat), false);
  }
  ffn_ = child<GeluFeedForward>(*this, "ffn", d, c.ffn_dim, dtype);
  scale_shift_table_ =
      register_parameter("scale_shift_table", uninitialized({1, 6, d}, at::kFloat), false);
}

at::Tensor WanTransformerBlock::forward(const at::Tensor& x, const at::Tensor& context,
                                        const at::Tensor& temb, const at::Tensor& rope_cos,
                                        const at::Tensor& rope_sin) {
  return invoke("forward", {x, context, temb, rope_cos, rope_sin},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return run({a[0].toTensor()}, {a[1].toTensor()}, {a[2].toTensor()},
                             {a[3].toTensor()}, {a[4].toTensor()})
                      .front();
                })
      .toTensor();
}

std::vector<at::Tensor> WanTransformerBlock::forward_passes(
    const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& contexts,
    const std::vector<at::Tensor>& tembs, const std::vector<at::Tensor>& rope_cos,
    const std::vector<at::Tensor>& rope_sin) {
  const size_t n = xs.size();
  OMNI_CHECK(n > 0 && contexts.size() == n && tembs.size() == n && rope_cos.size() == n &&
                 rope_sin.size() == n,
             "WanTransformerBlock::forward_passes: ", n, " activations, ", contexts.size(),
             " contexts, ", tembs.size(), " time embeddings and ", rope_cos.size(), "/",
             rope_sin.size(), " rotary tables");
  return invoke("forward_passes", {xs, contexts, tembs, rope_cos, rope_sin},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return run(a[0].toTensorVector(), a[1].toTensorVector(), a[2].toTensorVector(),
                             a[3].toTensorVector(), a[4].toTensorVector());
                })
      .toTensorVector();
}

std::vector<at::Tensor> WanTransformerBlock::run(std::vector<at::Tensor> hs,
                                                 const std::vector<at::Tensor>& contexts,
                                                 const std::vector<at::Tensor>& tembs,
                                                 const std::vector<at::Tensor>& cos,
                                                 const std::vector<at::Tensor>& sin) {
  const auto dtype = hs.front().scalar_type();
  // [B, T, 6, D] float32 -> six [B, T, D] per pass; passes sharing a temb share the result.
  std::vector<std::vector<at::Tensor>> mods;
  for (size_t k = 0; k < hs.size(); ++k) {
    mods.push_back(k > 0 && tembs[k].is_same(tembs[k - 1])
                       ? mods.back()
                       : (scale_shift_table_.unsqueeze(0) + tembs[k].to(at::kFloat)).unbind(2));
  }
  // Each phase for every pass before the next phase: under phase offload a phase is brought to
  // the device once for all of them.
  for (size_t k = 0; k < hs.size(); ++k) {
    auto& h = hs[k];
    const auto &shift_msa = mods[k][0], &scale_msa = mods[k][1], &gate_msa = mods[k][2];
    const auto n =
        (fp32_layer_norm(h.to(at::kFloat), {}, {}, eps_) * (1 + scale_msa) + shift_msa).to(dtype);
    const auto attn = attn1_->forward(n, at::Tensor(), cos[k], sin[k]);
    h = (h.to(at::kFloat) + attn * gate_msa).to(dtype);
  }
  for (size_t k = 0; k < hs.size(); ++k) {
    auto& h = hs[k];
    const auto n =
        cross_attn_norm_
            ? fp32_layer_norm(h.to(at::kFloat), norm2_weight_, norm2_bias_, eps_).to(dtype)
            : h;
    h = h + attn2_->forward(n, contexts[k], at::Tensor(), at::Tensor());
  }
  for (size_t k = 0; k < hs.size(); ++k) {
    auto& h = hs[k];
    const auto &c_shift = mods[k][3], &c_scale = mods[k][4], &c_gate = mods[k][5];
    const auto n =
        (fp32_layer_norm(h.to(at::kFloat), {}, {}, eps_) * (1 + c_scale) + c_shift).to(dtype);
    const auto ff = ffn_->forward(n);
    h = (h.to(at::kFloat) + ff.to(at::kFloat) * c_gate).to(dtype);
  }
  return hs;
}

WanTransformer3DModel::WanTransformer3DModel(const WanTransformerConfig& c, at::ScalarType dtype)
    : HookableModule("WanTransformer3DModel", {"forward", "forward_passes"}), c_(c), dtype_(dtype) {
  const int64_t d = c.inner_dim();
  h_dim_ = w_dim_ = 2 * (c.head_dim / 6);
  t_dim_ = c.head_dim - h_dim_ - w_dim_;
  OMNI_CHECK(t_dim_ > 0 && t_dim_ % 2 == 0 && h_dim_ > 0, "WanTransformer3DModel: head_dim ",
             c.head_dim, " cannot be split over (t, h, w) for the rotary embedding");
  std::vector<at::Tensor> cos, sin;
  for (int64_t dim : {t_dim_, h_dim_, w_dim_}) {
    auto [tc, ts] = rotary_table(dim, c.rope_max_seq_len, 10000.0);
    cos.push_back(tc);
    sin.push_back(ts);
  }
  rope_cos_ = at::cat(cos, 1);
  rope_sin_ = at::cat(sin, 1);

  auto patch = group(*this, "patch_embedding");
  patch_weight_ = patch->register_parameter(
      "weight", uninitialized({d, c.in_channels, c.patch_t, c.patch_h, c.patch_w}, dtype), false);
  patch_bias_ = patch->register_parameter("bias", uninitialized({d}, dtype), false);

  auto cond = group(*this, "condition_embedder");
  auto time = group(*cond, "time_embedder");  // float32, as diffusers keeps it
  time_linear_1_ = child<Linear>(*time, "linear_1", c.freq_dim, d, at::kFloat, true);
  time_linear_2_ = child<Linear>(*time, "linear_2", d, d, at::kFloat, true);
  time_proj_ = child<Linear>(*cond, "time_proj", d, 6 * d, dtype, true);
  auto text = group(*cond, "text_embedder");
  text_linear_1_ = child<Linear>(*text, "linear_1", c.text_dim, d, dtype, true);
  text_linear_2_ = child<Linear>(*text, "linear_2", d, d, dtype, true);

  blocks_ = register_module(kBlocks, torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks_->push_back(std::make_shared<WanTransformerBlock>(c, dtype));
  }
  proj_out_ = child<Linear>(*this, "proj_out", d,
                            c.out_channels * c.patch_t * c.patch_h * c.patch_w, dtype, true);
  scale_shift_table_ =
      register_parameter("scale_shift_table", uninitialized({1, 2, d}, at::kFloat), false);
}

std::pair<at::Tensor, at::Tensor> WanTransformer3DModel::rotary(int64_t frames, int64_t height,
                                                                int64_t width,
                                                                const c10::Device& device) const {
  const int64_t f = frames / c_.patch_t, h = height / c_.patch_h, w = width / c_.patch_w;
  OMNI_CHECK(f <= c_.rope_max_seq_len && h <= c_.rope_max_seq_len && w <= c_.rope_max_seq_len,
             "WanTransformer3DModel: a latent of ", f, " x ", h, " x ", w,
             " patches exceeds rope_max_seq_len ", c_.rope_max_seq_len);
  auto build = [&](const at::Tensor& table) {
    auto parts = table.split({t_dim_, h_dim_, w_dim_}, 1);
    auto pf = parts[0].narrow(0, 0, f).view({f, 1, 1, -1}).expand({f, h, w, -1});
    auto ph = parts[1].narrow(0, 0, h).view({1, h, 1, -1}).expand({f, h, w, -1});
    auto pw = parts[2].narrow(0, 0, w).view({1, 1, w, -1}).expand({f, h, w, -1});
    return at::cat({pf, ph, pw}, -1).reshape({1, f * h * w, 1, -1}).to(device);
  };
  return {build(rope_cos_), build(rope_sin_)};
}

at::Tensor WanTransformer3DModel::forward(const at::Tensor& hidden_states,
                                          const at::Tensor& timestep,
                                          const at::Tensor& encoder_hidden_states) {
  return invoke(
             "forward", {hidden_states, timestep, encoder_hidden_states},
             [this](offload::HookArgs& a) -> c10::IValue {
               return forward_impl({a[0].toTensor()}, {a[1].toTensor()}, {a[2].toTensor()}).front();
             })
      .toTensor();
}

std::vector<at::Tensor> WanTransformer3DModel::forward_passes(const std::vector<WanPass>& passes) {
  OMNI_CHECK(!passes.empty(), "WanTransformer3DModel::forward_passes: no pass");
  std::vector<at::Tensor> hidden, timesteps, texts;
  for (const auto& p : passes) {
    hidden.push_back(p.hidden_states);
    timesteps.push_back(p.timestep);
    texts.push_back(p.encoder_hidden_states);
  }
  return invoke("forward_passes", {hidden, timesteps, texts},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return forward_impl(a[0].toTensorVector(), a[1].toTensorVector(),
                                      a[2].toTensorVector());
                })
      .toTensorVector();
}

namespace {

// The index of the first pass before `k` whose `inputs` entry is the same tensor as k's, or k.
size_t first_same(const std::vector<at::Tensor>& inputs, size_t k) {
  for (size_t j = 0; j < k; ++j) {
    if (inputs[j].is_same(inputs[k])) return j;
  }
  return k;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> WanTransformer3DModel::time_embedding(
    const at::Tensor& timestep, int64_t batch, int64_t tokens, at::ScalarType dtype) const {
  // One timestep per sample ([B] -> T = 1) or per token ([B, L] -> T = L).
  int64_t t_len = 1;
  at::Tensor flat_t;
  if (timestep.dim() == 2) {
    OMNI_CHECK(timestep.size(0) == batch && timestep.size(1) == tokens,
               "WanTransformer3DModel: per-token timesteps must be [", batch, ", ", tokens,
               "], got ", timestep.sizes());
    t_len = tokens;
    flat_t = timestep.flatten();
  } else {
    OMNI_CHECK(timestep.dim() == 1 && timestep.size(0) == batch,
               "WanTransformer3DModel: timestep must be [", batch, "] or [", batch, ", ", tokens,
               "], got ", timestep.sizes());
    flat_t = timestep;
  }
  auto t_freq = sinusoidal_timesteps(flat_t, c_.freq_dim).view({batch, t_len, c_.freq_dim});
  t_freq = t_freq.to(time_linear_1_->weight.scalar_type());
  auto temb = time_linear_2_->forward(at::silu(time_linear_1_->forward(t_freq))).to(dtype);
  auto temb_proj = time_proj_->forward(at::silu(temb)).unflatten(2, {6, c_.inner_dim()});
  return {temb, temb_proj};  // [B, T, D], [B, T, 6, D]
}

std::vector<at::Tensor> WanTransformer3DModel::forward_impl(
    const std::vector<at::Tensor>& hidden_states, const std::vector<at::Tensor>& timesteps,
    const std::vector<at::Tensor>& texts) {
  const size_t n = hidden_states.size();
  OMNI_CHECK(timesteps.size() == n && texts.size() == n, "WanTransformer3DModel: ", n,
             " hidden_states, ", timesteps.size(), " timesteps and ", texts.size(),
             " encoder_hidden_states");
  // What each pass brings into the blocks; passes with the same latents (and timestep) share
  // their embeddings.
  struct Prepared {
    int64_t batch = 0, frames = 0, height = 0, width = 0, pf = 0, ph = 0, pw = 0;
    at::Tensor x, temb, temb_proj, rope_cos, rope_sin, context;
  };
  std::vector<Prepared> ps(n);
  for (size_t k = 0; k < n; ++k) {
    auto& p = ps[k];
    const auto& hs = hidden_states[k];
    const size_t j = first_same(hidden_states, k);
    if (j < k) {
      p = ps[j];
    } else {
      OMNI_CHECK(hs.dim() == 5 && hs.size(1) == c_.in_channels,
                 "WanTransformer3DModel: hidden_states must be [B, ", c_.in_channels,
                 ", F, H, W], got ", hs.sizes());
      p.batch = hs.size(0);
      p.frames = hs.size(2), p.height = hs.size(3), p.width = hs.size(4);
      OMNI_CHECK(
          p.frames % c_.patch_t == 0 && p.height % c_.patch_h == 0 && p.width % c_.patch_w == 0,
          "WanTransformer3DModel: latent ", p.frames, " x ", p.height, " x ", p.width,
          " is not a multiple of patch_size (", c_.patch_t, ", ", c_.patch_h, ", ", c_.patch_w,
          ")");
      p.pf = p.frames / c_.patch_t, p.ph = p.height / c_.patch_h, p.pw = p.width / c_.patch_w;
      std::tie(p.rope_cos, p.rope_sin) = rotary(p.frames, p.height, p.width, hs.device());
      p.x = at::conv3d(hs, patch_weight_, patch_bias_, {c_.patch_t, c_.patch_h, c_.patch_w});
      p.x = p.x.flatten(2).transpose(1, 2).contiguous();  // [B, L, D]
    }
    const auto& text = texts[k];
    OMNI_CHECK(text.dim() == 3 && text.size(0) == p.batch && text.size(2) == c_.text_dim,
               "WanTransformer3DModel: encoder_hidden_states must be [", p.batch, ", S, ",
               c_.text_dim, "], got ", text.sizes());
    if (j == k || !timesteps[k].is_same(timesteps[j])) {
      std::tie(p.temb, p.temb_proj) =
          time_embedding(timesteps[k], p.batch, p.pf * p.ph * p.pw, text.scalar_type());
    }
    p.context = text_linear_2_->forward(at::gelu(text_linear_1_->forward(text), "tanh"));
  }

  std::vector<at::Tensor> xs, contexts, tembs, cos, sin;
  for (const auto& p : ps) {
    xs.push_back(p.x);
    contexts.push_back(p.context);
    tembs.push_back(p.temb_proj);
    cos.push_back(p.rope_cos);
    sin.push_back(p.rope_sin);
  }
  for (const auto& block : *blocks_) {
    xs = block->as<WanTransformerBlock>()->forward_passes(xs, contexts, tembs, cos, sin);
  }

  for (size_t k = 0; k < n; ++k) {
    const auto& p = ps[k];
    auto& out = xs[k];
    // [B, T, 2, D] float32 -> shift, scale [B, T, D]
    auto mod = (scale_shift_table_.unsqueeze(0) + p.temb.unsqueeze(2)).unbind(2);
    out = (fp32_layer_norm(out.to(at::kFloat), {}, {}, c_.eps) * (1 + mod[1]) + mod[0])
              .to(out.scalar_type());
    out = proj_out_->forward(out);
    out = out.reshape({p.batch, p.pf, p.ph, p.pw, c_.patch_t, c_.patch_h, c_.patch_w, -1});
    out = out.permute({0, 7, 1, 4, 2, 5, 3, 6}).reshape({p.batch, -1, p.frames, p.height, p.width});
  }
  return xs;
}

std::shared_ptr<WanTransformer3DModel> load_wan_transformer(const std::string& dir,
                                                            at::ScalarType dtype) {
  const auto config = WanTransformerConfig::load(dir);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  auto model = std::make_shared<WanTransformer3DModel>(config, dtype);
  load_weights(*model, checkpoint, "");
  return model;
}

}  // namespace omni::models
