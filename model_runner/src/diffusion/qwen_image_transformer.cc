#include "model_runner/diffusion/qwen_image_transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"
#include "module_tree.h"

namespace omni::models {
namespace {

constexpr double kEps = 1e-6;  // every norm of the model; diffusers does not make it a field
constexpr double kRopeTheta = 10000.0;

at::Tensor layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, kEps); }

// x * (1 + scale) + shift with [B, D] parameters over [B, L, D].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

// apply_rotary_emb_qwen(use_real = False): channels (2i, 2i + 1) are one complex number,
// multiplied by (cos, sin) [L, d / 2] in float32; x [B, L, H, d].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto pairs = x.to(at::kFloat).unflatten(-1, {-1, 2});
  auto re = pairs.select(-1, 0), im = pairs.select(-1, 1);
  auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [L, 1, d / 2]
  return at::stack({re * c - im * s, re * s + im * c}, -1).flatten(-2).to(x.scalar_type());
}

// QwenEmbedRope.rope_params for the positions of one axis: angle = position * theta^(-2i/dim),
// in float32 as the reference computes it.
at::Tensor axis_angles(const at::Tensor& positions, int64_t dim) {
  auto inv_freq = at::pow(kRopeTheta, at::arange(0, dim, 2, at::kFloat).div(dim)).reciprocal();
  return at::outer(positions.to(at::kFloat), inv_freq);
}

// scale_rope: an axis of n patches is centred, positions -(n - n/2) .. n/2 - 1.
at::Tensor centred(int64_t n) { return at::arange(n, at::kLong) - (n - n / 2); }

void check_field(const HfConfig& json, bool ok, const std::string& field, const std::string& value,
                 const std::string& why) {
  OMNI_CHECK(ok, json.source(), ": field '", field, "' = ", value, " is not supported by ",
             "QwenImageTransformer2DModel: ", why);
}

c10::IValue pair_of(const at::Tensor& a, const at::Tensor& b) {
  return c10::ivalue::Tuple::create({a, b});
}

std::pair<at::Tensor, at::Tensor> unpair(const c10::IValue& v) {
  const auto& e = v.toTupleRef().elements();
  return {e[0].toTensor(), e[1].toTensor()};
}

}  // namespace

QwenImageTransformerConfig QwenImageTransformerConfig::from_hf(const HfConfig& json) {
  const std::string cls = json.get_string("_class_name", "QwenImageTransformer2DModel");
  check_field(json, cls == "QwenImageTransformer2DModel", "_class_name", "\"" + cls + "\"",
              "expected \"QwenImageTransformer2DModel\"");
  QwenImageTransformerConfig c;
  auto positive = [&json](const char* field, int64_t fallback) {
    const int64_t v = json.get_int(field, fallback);
    check_field(json, v > 0, field, std::to_string(v), "must be positive");
    return v;
  };
  c.patch_size = positive("patch_size", 2);
  c.in_channels = positive("in_channels", 64);
  c.out_channels = json.has("out_channels") ? positive("out_channels", 16) : c.in_channels;
  c.num_layers = positive("num_layers", 60);
  c.head_dim = positive("attention_head_dim", 128);
  c.num_heads = positive("num_attention_heads", 24);
  c.joint_attention_dim = positive("joint_attention_dim", 3584);
  const auto axes = json.get_int_list("axes_dims_rope", std::vector<int64_t>{16, 56, 56});
  const bool axes_ok =
      axes.size() == 3 &&
      std::all_of(axes.begin(), axes.end(), [](int64_t a) { return a > 0 && a % 2 == 0; }) &&
      axes[0] + axes[1] + axes[2] == c.head_dim;
  check_field(json, axes_ok, "axes_dims_rope", nlohmann::json(axes).dump(),
              "expected 3 positive even sizes summing to attention_head_dim (" +
                  std::to_string(c.head_dim) + ")");
  c.axes_dims_rope = {axes[0], axes[1], axes[2]};
  for (const char* field :
       {"guidance_embeds", "zero_cond_t", "use_additional_t_cond", "use_layer3d_rope"}) {
    const bool on = json.get_bool(field, false);
    check_field(json, !on, field, "true",
                "not implemented (Qwen-Image, Edit and Edit-2509 set false)");
  }
  return c;
}

QwenImageTransformerConfig QwenImageTransformerConfig::load(const std::string& path) {
  return from_hf(HfConfig::load(path));
}

QwenImageModulation::QwenImageModulation(int64_t dim, at::ScalarType dtype)
    : HookableModule("QwenImageModulation") {
  linear_ = child<Linear>(*this, "1", dim, 6 * dim, dtype, true);
}

at::Tensor QwenImageModulation::forward(const at::Tensor& temb) {
  return invoke("forward", {temb},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return linear_->forward(at::silu(a[0].toTensor()));
                })
      .toTensor();
}

QwenImageJointAttention::QwenImageJointAttention(const QwenImageTransformerConfig& c,
                                                 at::ScalarType dtype)
    : HookableModule("QwenImageJointAttention"), heads_(c.num_heads) {
  const int64_t d = c.inner_dim();
  to_q_ = child<Linear>(*this, "to_q", d, d, dtype, true);
  to_k_ = child<Linear>(*this, "to_k", d, d, dtype, true);
  to_v_ = child<Linear>(*this, "to_v", d, d, dtype, true);
  add_q_proj_ = child<Linear>(*this, "add_q_proj", d, d, dtype, true);
  add_k_proj_ = child<Linear>(*this, "add_k_proj", d, d, dtype, true);
  add_v_proj_ = child<Linear>(*this, "add_v_proj", d, d, dtype, true);
  norm_q_ = child<RMSNorm>(*this, "norm_q", c.head_dim, dtype, kEps);
  norm_k_ = child<RMSNorm>(*this, "norm_k", c.head_dim, dtype, kEps);
  norm_added_q_ = child<RMSNorm>(*this, "norm_added_q", c.head_dim, dtype, kEps);
  norm_added_k_ = child<RMSNorm>(*this, "norm_added_k", c.head_dim, dtype, kEps);
  to_out_ = child<Linear>(*group(*this, "to_out"), "0", d, d, dtype, true);
  to_add_out_ = child<Linear>(*this, "to_add_out", d, d, dtype, true);
}

std::pair<at::Tensor, at::Tensor> QwenImageJointAttention::forward(const at::Tensor& image,
                                                                   const at::Tensor& text,
                                                                   const at::Tensor& text_mask,
                                                                   const QwenImageRotary& r) {
  auto out = invoke(
      "forward", {image, text, text_mask, r.image_cos, r.image_sin, r.text_cos, r.text_sin},
      [this](offload::HookArgs& a) -> c10::IValue {
        const at::Tensor img = a[0].toTensor(), txt = a[1].toTensor(), mask = a[2].toTensor();
        const at::Tensor img_cos = a[3].toTensor(), img_sin = a[4].toTensor();
        const at::Tensor txt_cos = a[5].toTensor(), txt_sin = a[6].toTensor();
        auto heads = [this](const at::Tensor& x) { return x.unflatten(-1, {heads_, -1}); };
        auto img_q = apply_rotary(norm_q_->forward(heads(to_q_->forward(img))), img_cos, img_sin);
        auto img_k = apply_rotary(norm_k_->forward(heads(to_k_->forward(img))), img_cos, img_sin);
        auto img_v = heads(to_v_->forward(img));
        auto txt_q = apply_rotary(norm_added_q_->forward(heads(add_q_proj_->forward(txt))), txt_cos,
                                  txt_sin);
        auto txt_k = apply_rotary(norm_added_k_->forward(heads(add_k_proj_->forward(txt))), txt_cos,
                                  txt_sin);
        auto txt_v = heads(add_v_proj_->forward(txt));
        // [B, S + L, H, d] -> [B, H, S + L, d]: text first, as the reference joins them.
        auto q = at::cat({txt_q, img_q}, 1).transpose(1, 2);
        auto k = at::cat({txt_k, img_k}, 1).transpose(1, 2);
        auto v = at::cat({txt_v, img_v}, 1).transpose(1, 2);
        std::optional<at::Tensor> joint_mask;
        if (mask.defined()) {
          auto image_valid = at::ones({img.size(0), img.size(1)}, mask.options().dtype(at::kBool));
          joint_mask = at::cat({mask.to(at::kBool), image_valid}, 1).view({img.size(0), 1, 1, -1});
        }
        auto o = at::scaled_dot_product_attention(q, k, v, joint_mask);
        o = o.transpose(1, 2).flatten(2, 3).to(q.scalar_type());
        const int64_t s = txt.size(1);
        auto img_out = to_out_->forward(o.narrow(1, s, o.size(1) - s).contiguous());
        auto txt_out = to_add_out_->forward(o.narrow(1, 0, s).contiguous());
        return pair_of(img_out, txt_out);
      });
  return unpair(out);
}

QwenImageTransformerBlock::QwenImageTransformerBlock(const QwenImageTransformerConfig& c,
                                                     at::ScalarType dtype)
    : HookableModule("QwenImageTransformerBlock", {"forward", "forward_passes"}) {
  const int64_t d = c.inner_dim();
  // Registered in execution order: phase granularity streams them in this order.
  img_mod_ = child<QwenImageModulation>(*this, "img_mod", d, dtype);
  txt_mod_ = child<QwenImageModulation>(*this, "txt_mod", d, dtype);
  attn_ = child<QwenImageJointAttention>(*this, "attn", c, dtype);
  img_mlp_ = child<GeluFeedForward>(*this, "img_mlp", d, 4 * d, dtype);
  txt_mlp_ = child<GeluFeedForward>(*this, "txt_mlp", d, 4 * d, dtype);
}

std::pair<at::Tensor, at::Tensor> QwenImageTransformerBlock::forward(const at::Tensor& image,
                                                                     const at::Tensor& text,
                                                                     const at::Tensor& text_mask,
                                                                     const at::Tensor& temb,
                                                                     const QwenImageRotary& r) {
  auto out = invoke(
      "forward", {image, text, text_mask, temb, r.image_cos, r.image_sin, r.text_cos, r.text_sin},
      [this](offload::HookArgs& a) -> c10::IValue {
        std::vector<QwenImagePass> passes = {
            {a[0].toTensor(), a[1].toTensor(), a[2].toTensor(),
             QwenImageRotary{a[4].toTensor(), a[5].toTensor(), a[6].toTensor(), a[7].toTensor()}}};
        run(passes, a[3].toTensor());
        return pair_of(passes[0].image, passes[0].text);
      });
  return unpair(out);
}

void QwenImageTransformerBlock::forward_passes(std::vector<QwenImagePass>& passes,
                                               const at::Tensor& temb) {
  OMNI_CHECK(!passes.empty(), "QwenImageTransformerBlock::forward_passes: no pass");
  // The hooks see the activations; the masks and angles travel with `passes`.
  std::vector<at::Tensor> images, texts;
  for (const auto& p : passes) {
    images.push_back(p.image);
    texts.push_back(p.text);
  }
  invoke("forward_passes", {images, texts, temb}, [&](offload::HookArgs& a) -> c10::IValue {
    run(passes, a[2].toTensor());
    return c10::IValue();
  });
}

void QwenImageTransformerBlock::run(std::vector<QwenImagePass>& passes, const at::Tensor& t) {
  // Each [B, 6D]: (shift, scale, gate) before attention, then before the FFN.
  const auto img_mod = img_mod_->forward(t).chunk(6, -1);
  const auto txt_mod = txt_mod_->forward(t).chunk(6, -1);
  // Each phase for every pass before the next phase: under phase offload a phase is brought to
  // the device once for all of them.
  for (auto& p : passes) {
    auto [img_attn, txt_attn] =
        attn_->forward(modulate(layer_norm(p.image), img_mod[0], img_mod[1]),
                       modulate(layer_norm(p.text), txt_mod[0], txt_mod[1]), p.text_mask, p.rotary);
    p.image = p.image + img_mod[2].unsqueeze(1) * img_attn;
    p.text = p.text + txt_mod[2].unsqueeze(1) * txt_attn;
  }
  for (auto& p : passes) {
    auto img_ff = img_mlp_->forward(modulate(layer_norm(p.image), img_mod[3], img_mod[4]));
    p.image = p.image + img_mod[5].unsqueeze(1) * img_ff;
  }
  for (auto& p : passes) {
    auto txt_ff = txt_mlp_->forward(modulate(layer_norm(p.text), txt_mod[3], txt_mod[4]));
    p.text = p.text + txt_mod[5].unsqueeze(1) * txt_ff;
    if (p.image.scalar_type() == at::kHalf) {  // as the reference clips float16
      p.image = p.image.clamp(-65504, 65504);
      p.text = p.text.clamp(-65504, 65504);
    }
  }
}

QwenImageTransformer2DModel::QwenImageTransformer2DModel(const QwenImageTransformerConfig& c,
                                                         at::ScalarType dtype)
    : HookableModule("QwenImageTransformer2DModel", {"forward", "forward_passes"}),
      c_(c),
      dtype_(dtype) {
  const int64_t d = c.inner_dim();
  auto time = group(*group(*this, "time_text_embed"), "timestep_embedder");
  time_linear_1_ = child<Linear>(*time, "linear_1", 256, d, dtype, true);
  time_linear_2_ = child<Linear>(*time, "linear_2", d, d, dtype, true);
  txt_norm_ = child<RMSNorm>(*this, "txt_norm", c.joint_attention_dim, dtype, kEps);
  img_in_ = child<Linear>(*this, "img_in", c.in_channels, d, dtype, true);
  txt_in_ = child<Linear>(*this, "txt_in", c.joint_attention_dim, d, dtype, true);
  blocks_ = register_module(kBlocks, torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks_->push_back(std::make_shared<QwenImageTransformerBlock>(c, dtype));
  }
  norm_out_linear_ = child<Linear>(*group(*this, "norm_out"), "linear", d, 2 * d, dtype, true);
  proj_out_ = child<Linear>(*this, "proj_out", d, c.patch_size * c.patch_size * c.out_channels,
                            dtype, true);
}

std::vector<std::string> QwenImageTransformer2DModel::block_phases() {
  return {"img_mod", "txt_mod", "attn", "img_mlp", "txt_mlp"};
}

QwenImageRotary QwenImageTransformer2DModel::rotary(const std::vector<QwenImageShape>& images,
                                                    int64_t text_len,
                                                    const c10::Device& device) const {
  OMNI_CHECK(!images.empty(), "QwenImageTransformer2DModel: no image shapes given");
  const auto& [df, dh, dw] = c_.axes_dims_rope;
  std::vector<at::Tensor> angles;
  int64_t max_extent = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const auto& [f, h, w] = images[i];
    OMNI_CHECK(f > 0 && h > 0 && w > 0, "QwenImageTransformer2DModel: image ", i, " has shape (", f,
               ", ", h, ", ", w, ")");
    // The i-th image's frames start at frame position i.
    auto frame = axis_angles(
        at::arange(static_cast<int64_t>(i), static_cast<int64_t>(i) + f, at::kLong), df);
    auto rows = axis_angles(centred(h), dh), cols = axis_angles(centred(w), dw);
    angles.push_back(at::cat({frame.view({f, 1, 1, -1}).expand({f, h, w, -1}),
                              rows.view({1, h, 1, -1}).expand({f, h, w, -1}),
                              cols.view({1, 1, w, -1}).expand({f, h, w, -1})},
                             -1)
                         .reshape({f * h * w, -1}));
    max_extent = std::max({max_extent, h / 2, w / 2});
  }
  auto image = at::cat(angles, 0);
  // Text tokens sit on the diagonal after the largest image's extent, on all three axes.
  auto text_pos = at::arange(max_extent, max_extent + text_len, at::kLong);
  auto text = at::cat(
      {axis_angles(text_pos, df), axis_angles(text_pos, dh), axis_angles(text_pos, dw)}, -1);
  return {at::cos(image).to(device), at::sin(image).to(device), at::cos(text).to(device),
          at::sin(text).to(device)};
}

at::Tensor QwenImageTransformer2DModel::forward(const at::Tensor& hidden_states,
                                                const at::Tensor& encoder_hidden_states,
                                                const at::Tensor& text_mask,
                                                const at::Tensor& timestep,
                                                const std::vector<QwenImageShape>& images) {
  std::vector<QwenImageText> texts = {{encoder_hidden_states, text_mask}};
  check_inputs(hidden_states, texts, timestep, images);
  auto out = invoke("forward", {hidden_states, encoder_hidden_states, text_mask, timestep},
                    [&](offload::HookArgs& a) -> c10::IValue {
                      texts = {{a[1].toTensor(), a[2].toTensor()}};
                      return run(a[0].toTensor(), texts, a[3].toTensor(), images).front();
                    });
  return out.toTensor();
}

std::vector<at::Tensor> QwenImageTransformer2DModel::forward_passes(
    const at::Tensor& hidden_states, const std::vector<QwenImageText>& texts,
    const at::Tensor& timestep, const std::vector<QwenImageShape>& images) {
  check_inputs(hidden_states, texts, timestep, images);
  std::vector<at::Tensor> embeds;
  for (const auto& text : texts) embeds.push_back(text.embeds);
  return invoke("forward_passes", {hidden_states, embeds, timestep},
                [&](offload::HookArgs& a) -> c10::IValue {
                  return run(a[0].toTensor(), texts, a[2].toTensor(), images);
                })
      .toTensorVector();
}

void QwenImageTransformer2DModel::check_inputs(const at::Tensor& hidden_states,
                                               const std::vector<QwenImageText>& texts,
                                               const at::Tensor& timestep,
                                               const std::vector<QwenImageShape>& images) const {
  OMNI_CHECK(hidden_states.dim() == 3 && hidden_states.size(2) == c_.in_channels,
             "QwenImageTransformer2DModel: hidden_states must be [B, L, ", c_.in_channels,
             "], got ", hidden_states.sizes());
  const int64_t batch = hidden_states.size(0);
  int64_t tokens = 0;
  for (const auto& s : images) tokens += s.frames * s.height * s.width;
  OMNI_CHECK(hidden_states.size(1) == tokens, "QwenImageTransformer2DModel: hidden_states has ",
             hidden_states.size(1), " tokens, the image shapes ", tokens);
  OMNI_CHECK(!texts.empty(), "QwenImageTransformer2DModel: no text given");
  for (const auto& [embeds, mask] : texts) {
    OMNI_CHECK(
        embeds.dim() == 3 && embeds.size(0) == batch && embeds.size(2) == c_.joint_attention_dim,
        "QwenImageTransformer2DModel: encoder_hidden_states must be [", batch, ", S, ",
        c_.joint_attention_dim, "], got ", embeds.sizes());
    const int64_t text_len = embeds.size(1);
    OMNI_CHECK(!mask.defined() || mask.sizes() == at::IntArrayRef({batch, text_len}),
               "QwenImageTransformer2DModel: the text mask must be [", batch, ", ", text_len,
               "], got ", mask.sizes());
  }
  OMNI_CHECK(timestep.dim() == 1 && timestep.size(0) == batch,
             "QwenImageTransformer2DModel: timestep must be [", batch, "], got ", timestep.sizes());
}

std::vector<at::Tensor> QwenImageTransformer2DModel::run(
    const at::Tensor& hidden_states, const std::vector<QwenImageText>& texts,
    const at::Tensor& timestep, const std::vector<QwenImageShape>& images) {
  auto img = img_in_->forward(hidden_states);
  const auto dtype = img.scalar_type();
  const auto t = timestep.to(dtype);
  auto temb = time_linear_2_->forward(
      at::silu(time_linear_1_->forward(sinusoidal_timesteps(t, 256, 1000.0).to(dtype))));
  // The passes (the guidance's conditional and unconditional ones) share the latents and the
  // timestep, and go through the blocks block-major: each block is visited once for all.
  // One rotary table for the longest text: a shorter text's positions are its first rows.
  int64_t longest = 0;
  for (const auto& text : texts) longest = std::max(longest, text.embeds.size(1));
  const auto rot = rotary(images, longest, hidden_states.device());
  std::vector<QwenImagePass> passes;
  for (const auto& [embeds, mask] : texts) {
    const int64_t n = embeds.size(1);
    passes.push_back({img,
                      txt_in_->forward(txt_norm_->forward(embeds)),
                      mask.defined() ? mask.to(at::kBool) : at::Tensor(),
                      {rot.image_cos, rot.image_sin, rot.text_cos.narrow(0, 0, n),
                       rot.text_sin.narrow(0, 0, n)}});
  }
  for (const auto& block : *blocks_) {
    block->as<QwenImageTransformerBlock>()->forward_passes(passes, temb);
  }
  // AdaLayerNormContinuous: (scale, shift) from the time embedding.
  const auto emb = norm_out_linear_->forward(at::silu(temb).to(dtype)).chunk(2, 1);
  std::vector<at::Tensor> out;
  for (const auto& p : passes) {
    out.push_back(proj_out_->forward(modulate(layer_norm(p.image), emb[1], emb[0])));
  }
  return out;
}

std::shared_ptr<QwenImageTransformer2DModel> load_qwen_image_transformer(const std::string& dir,
                                                                         at::ScalarType dtype) {
  const auto config = QwenImageTransformerConfig::load(dir);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  auto model = std::make_shared<QwenImageTransformer2DModel>(config, dtype);
  load_weights(*model, checkpoint, "");
  return model;
}

}  // namespace omni::models
