// Small ops of the rotary-position GQA decoders (Qwen2.5, Qwen3-Omni), shared across the
// families and written as the Hugging Face reference writes them, so that the float rounding
// matches it.
#pragma once

#include <ATen/ATen.h>

namespace omni::models {

// The rotary embedding's half rotation: (x1, x2) -> (-x2, x1) over the last dimension.
inline at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// [B, kv_heads, L, d] -> [B, kv_heads * n_rep, L, d], each kv head repeated n_rep times (GQA).
inline at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto s = x.sizes();
  return x.unsqueeze(2)
      .expand({s[0], s[1], n_rep, s[2], s[3]})
      .reshape({s[0], s[1] * n_rep, s[2], s[3]});
}

// Default rope's inverse frequencies [head_dim / 2] in float32 on `device`:
// 1 / theta ** (arange(0, head_dim, 2) / head_dim), computed in float32 as the reference does.
inline at::Tensor rope_inv_freq(double theta, int64_t head_dim, const at::Device& device) {
  const auto exponents = at::arange(0, head_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) /
                         static_cast<double>(head_dim);
  return (1.0 / at::pow(theta, exponents)).to(device);
}

// x * cos + rotate_half(x) * sin; cos / sin broadcast against x.
inline at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

}  // namespace omni::models
