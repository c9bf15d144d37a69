// Layers that several diffusers DiTs share (Wan, Qwen-Image, and the MMDiTs that follow), under
// diffusers' parameter names.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"

namespace omni::models {

// diffusers' Timesteps(num_channels = dim, flip_sin_to_cos = True, downscale_freq_shift = 0,
// scale): [N] -> [N, dim] float32, cos first.
at::Tensor sinusoidal_timesteps(const at::Tensor& t, int64_t dim, double scale = 1.0);

// diffusers' FeedForward(activation_fn = "gelu-approximate"): net.0.proj, gelu tanh, net.2.
// Hookable: the offload engine's phase granularity streams it as a unit of its own.
class GeluFeedForward : public offload::HookableModule {
 public:
  GeluFeedForward(int64_t dim, int64_t inner, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<Linear> proj_, out_;  // "net.0.proj", "net.2"
};

}  // namespace omni::models
