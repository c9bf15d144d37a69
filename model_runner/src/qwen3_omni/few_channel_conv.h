// Causal Conv1d (stride 1, no groups) and trimmed ConvTranspose1d with few input channels, on
// CPU float32, in one pass each: code2wav's last decoder blocks run 4 to 32 channels over its
// longest tensors, where ATen's oneDNN and im2col paths vectorize over channels and idle, and
// the causal padding and the trim are copies.
#pragma once

#include <ATen/ATen.h>

namespace omni::models::qwen3_omni {

// The most input channels the pass takes; above it ATen's paths are as fast.
constexpr int64_t kFewChannelConvMaxInputs = 32;

// Whether few_channel_causal_conv applies: x [B, C_in, T] and weight [C_out, C_in, K] CPU
// float32 (bias too, if defined), stride 1, one group, C_in <= kFewChannelConvMaxInputs.
bool few_channel_conv_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t stride, int64_t groups);

// conv1d(pad(x, ((K - 1) * dilation, 0)), weight, bias, dilation): [B, C_out, T], contiguous.
// Each sample's rows are summed in one order (input channel, then tap), so a sample gives the
// same bits alone or in a batch. Only where few_channel_conv_applies.
at::Tensor few_channel_causal_conv(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, int64_t dilation);

// Whether few_channel_trimmed_transposed_conv applies: x [B, C_in, T] and weight
// [C_in, C_out, K] CPU float32 (bias [C_out] too, if defined), C_in <= kFewChannelConvMaxInputs,
// K a multiple of the stride.
bool few_channel_transposed_conv_applies(const at::Tensor& x, const at::Tensor& weight,
                                         const at::Tensor& bias, int64_t stride);

// conv_transpose1d(x, weight, bias, stride) without its first and last K - stride samples:
// [B, C_out, (T + 1) * stride - K], contiguous. Each output phase (position mod stride) is a
// causal conv over x with every stride-th tap, all phases in one few_channel_causal_conv, then
// interleaved. Only where few_channel_transposed_conv_applies.
at::Tensor few_channel_trimmed_transposed_conv(const at::Tensor& x, const at::Tensor& weight,
                                               const at::Tensor& bias, int64_t stride);

}  // namespace omni::models::qwen3_omni
