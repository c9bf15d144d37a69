// The rotary embedding's half rotation shared by the text decoder and the vision encoder:
// (x1, x2) -> (-x2, x1) over the last dimension, as the Hugging Face reference writes it.
#pragma once

#include <ATen/ATen.h>

namespace omni::models::qwen3_omni {

inline at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace omni::models::qwen3_omni
