#include "model_runner/layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "cpu_offload/check.h"

namespace omni::models {

at::Tensor init_normal(at::IntArrayRef sizes, double std, at::Generator& gen,
                       at::ScalarType dtype) {
  return at::normal(0.0, std, sizes, gen, at::TensorOptions(at::kFloat)).to(dtype);
}

at::Tensor uninitialized(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions(dtype));
}

Linear::Linear(int64_t in, int64_t out, at::ScalarType dtype, bool has_bias)
    : torch::nn::Module("Linear") {
  weight = register_parameter("weight", uninitialized({out, in}, dtype), false);
  if (has_bias) bias = register_parameter("bias", uninitialized({out}, dtype), false);
}

Linear::Linear(int64_t in, int64_t out, at::Generator& gen, at::ScalarType dtype, bool has_bias)
    : torch::nn::Module("Linear") {
  weight = register_parameter("weight", init_normal({out, in}, 1.0 / std::sqrt(in), gen, dtype),
                              /*requires_grad=*/false);
  if (has_bias) {
    bias = register_parameter("bias", init_normal({out}, 0.02, gen, dtype), false);
  }
}

at::Tensor Linear::forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

HookableLinear::HookableLinear(int64_t in, int64_t out, at::ScalarType dtype, bool has_bias)
    : offload::HookableModule("HookableLinear") {
  weight = register_parameter("weight", uninitialized({out, in}, dtype), false);
  if (has_bias) bias = register_parameter("bias", uninitialized({out}, dtype), false);
}

at::Tensor HookableLinear::forward(const at::Tensor& x) {
  // The parameters are read inside the hooked call: an offload hook may rebind them.
  return invoke("forward", {x},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return at::linear(a[0].toTensor(), weight, bias);
                })
      .toTensor();
}

LayerNorm::LayerNorm(int64_t dim, at::Generator& gen, at::ScalarType dtype, double eps_)
    : torch::nn::Module("LayerNorm"), eps(eps_) {
  weight = register_parameter("weight", (1.0 + init_normal({dim}, 0.02, gen, at::kFloat)).to(dtype),
                              false);
  bias = register_parameter("bias", init_normal({dim}, 0.02, gen, dtype), false);
}

LayerNorm::LayerNorm(int64_t dim, at::ScalarType dtype, double eps_)
    : torch::nn::Module("LayerNorm"), eps(eps_) {
  weight = register_parameter("weight", uninitialized({dim}, dtype), false);
  bias = register_parameter("bias", uninitialized({dim}, dtype), false);
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, at::Generator& gen, at::ScalarType dtype)
    : torch::nn::Module("Conv2d"), padding(kernel / 2) {
  weight = register_parameter(
      "weight",
      init_normal({out, in, kernel, kernel}, 1.0 / std::sqrt(in * kernel * kernel), gen, dtype),
      false);
  bias = register_parameter("bias", init_normal({out}, 0.02, gen, dtype), false);
}

at::Tensor Conv2d::forward(const at::Tensor& x) const {
  return at::conv2d(x, weight, bias, /*stride=*/{1, 1}, /*padding=*/{padding, padding});
}

Embedding::Embedding(int64_t vocab, int64_t dim, at::Generator& gen, at::ScalarType dtype)
    : torch::nn::Module("Embedding") {
  weight = register_parameter("weight", init_normal({vocab, dim}, 1.0, gen, dtype), false);
}

Embedding::Embedding(int64_t vocab, int64_t dim, at::ScalarType dtype)
    : torch::nn::Module("Embedding") {
  weight = register_parameter("weight", uninitialized({vocab, dim}, dtype), false);
}

RMSNorm::RMSNorm(int64_t dim, at::ScalarType dtype, double eps_)
    : torch::nn::Module("RMSNorm"),
      eps(eps_),
      eps_f32_(at::scalar_tensor(eps_, at::kFloat)),
      width_f32_(at::scalar_tensor(static_cast<double>(dim), at::kFloat)) {
  weight = register_parameter("weight", uninitialized({dim}, dtype), false);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  OMNI_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "RMSNorm: input width ",
             x.dim() ? x.size(-1) : 0, " differs from the weight's ", weight.size(0));
  const bool is_float = x.scalar_type() == at::kFloat;
  const auto xf = is_float ? x : x.to(at::kFloat);
  // The reference's float32 steps, bit for bit. On the CPU, mean(x^2) is ATen's sum / width
  // (other devices' mean kernels differ), and the in-place ops write into tensors made here.
  const auto inv_rms =
      xf.is_cpu()
          ? at::sum(xf.pow(2), -1, /*keepdim=*/true).div_(width_f32_).add_(eps_f32_).rsqrt_()
          : at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  const auto normed = xf * inv_rms;
  return weight * (is_float ? normed : normed.to(x.scalar_type()));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  return at::matmul(at::softmax(scores, -1), v);
}

at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  const auto b = x.size(0), l = x.size(1), d = x.size(2);
  return x.view({b, l, heads, d / heads}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
  const auto b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3);
  return x.transpose(1, 2).reshape({b, l, h * d});
}

at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens) {
  const int64_t heads = q.size(0), total = q.size(1), head_dim = q.size(2);
  OMNI_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0 && cu_seqlens.back() == total,
             "attention segments must cover the ", total, " tokens exactly");
  const double scaling = std::pow(static_cast<double>(head_dim), -0.5);
  std::vector<at::Tensor> outputs;
  size_t i = 0;
  while (i + 1 < cu_seqlens.size()) {
    // A run of `count` consecutive segments of `n` tokens each: one batched product.
    const int64_t start = cu_seqlens[i], n = cu_seqlens[i + 1] - cu_seqlens[i];
    OMNI_CHECK(n >= 0, "attention segment bounds must not decrease");
    size_t j = i + 1;
    while (j + 1 < cu_seqlens.size() && cu_seqlens[j + 1] - cu_seqlens[j] == n) ++j;
    const int64_t count = static_cast<int64_t>(j - i);
    i = j;
    if (n == 0) continue;
    auto segments = [&](const at::Tensor& t) {  // [count, heads, n, head_dim]
      return t.narrow(1, start, count * n).reshape({heads, count, n, head_dim}).transpose(0, 1);
    };
    auto qs = segments(q), ks = segments(k), vs = segments(v);
    auto scores = at::matmul(qs, ks.transpose(-2, -1)) * scaling;
    auto probs = at::softmax(scores, -1, at::kFloat).to(qs.scalar_type());
    // [count, heads, n, head_dim] -> [count * n, heads, head_dim]
    outputs.push_back(at::matmul(probs, vs).transpose(1, 2).reshape({count * n, heads, head_dim}));
  }
  return at::cat(outputs, 0).reshape({total, heads * head_dim});
}

}  // namespace omni::models
