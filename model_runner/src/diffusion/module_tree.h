// Building a torch::nn::Module tree under the reference's parameter names, for the diffusion
// models (internal to model_runner/src/diffusion).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>

namespace omni::models {

// Registers a new M(args...) under `parent` as `name` and returns it.
template <typename M, typename... Args>
std::shared_ptr<M> child(torch::nn::Module& parent, const std::string& name, Args&&... args) {
  return parent.register_module(name, std::make_shared<M>(std::forward<Args>(args)...));
}

// A container without parameters of its own, for the reference's nesting of names
// ("condition_embedder.time_embedder", "to_out.0", "resample.1").
inline std::shared_ptr<torch::nn::Module> group(torch::nn::Module& parent,
                                                const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>(name));
}

}  // namespace omni::models
