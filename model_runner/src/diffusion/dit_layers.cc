#include "model_runner/diffusion/dit_layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "module_tree.h"

namespace omni::models {

at::Tensor sinusoidal_timesteps(const at::Tensor& t, int64_t dim, double scale) {
  const int64_t half = dim / 2;
  auto exponent = at::arange(half, t.options().dtype(at::kFloat)) * (-std::log(10000.0));
  exponent = exponent / static_cast<double>(half);
  auto args = t.to(at::kFloat).unsqueeze(1) * at::exp(exponent).unsqueeze(0);
  if (scale != 1.0) args = args * scale;  // after the product, as diffusers orders it
  auto emb = at::cat({at::cos(args), at::sin(args)}, -1);
  if (dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1, 0, 0});
  return emb;
}

GeluFeedForward::GeluFeedForward(int64_t dim, int64_t inner, at::ScalarType dtype)
    : HookableModule("GeluFeedForward") {
  auto net = group(*this, "net");
  proj_ = child<Linear>(*group(*net, "0"), "proj", dim, inner, dtype, true);
  out_ = child<Linear>(*net, "2", inner, dim, dtype, true);
}

at::Tensor GeluFeedForward::forward(const at::Tensor& x) {
  return invoke("forward", {x},
                [this](offload::HookArgs& a) -> c10::IValue {
                  return out_->forward(at::gelu(proj_->forward(a[0].toTensor()), "tanh"));
                })
      .toTensor();
}

}  // namespace omni::models
