// Small attention helpers shared by the text decoders, the vision encoder and code2wav, written
// as the Hugging Face reference writes them.
#pragma once

#include <ATen/ATen.h>

namespace omni::models::qwen3_omni {

// The rotary embedding's half rotation: (x1, x2) -> (-x2, x1) over the last dimension.
inline at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// [1, kv_heads, L, d] -> [1, kv_heads * n_rep, L, d], each kv head repeated n_rep times (GQA).
inline at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto s = x.sizes();
  return x.unsqueeze(2)
      .expand({s[0], s[1], n_rep, s[2], s[3]})
      .reshape({s[0], s[1] * n_rep, s[2], s[3]});
}

}  // namespace omni::models::qwen3_omni
