// SnakeBeta, x + inv_beta * sin(x * alpha)^2 per channel, in one pass over a CPU float32 tensor:
// the reference's five elementwise ops each stream the whole activation through memory, and
// code2wav's decoder runs it on its longest tensors.
#pragma once

#include <ATen/ATen.h>

namespace omni::models::qwen3_omni {

// x [B, C, T]; alpha and inv_beta [C] (already exp(alpha) and 1 / (exp(beta) + 1e-9)). Returns
// a new tensor. Where fused_snake_beta_applies(x) is false, or some |x * alpha| is too large for
// the fast sine's range reduction, it computes the reference's ATen ops instead.
at::Tensor snake_beta(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta);

// Whether snake_beta takes the fused pass: a CPU float32 tensor of 3 dimensions.
bool fused_snake_beta_applies(const at::Tensor& x);

}  // namespace omni::models::qwen3_omni
