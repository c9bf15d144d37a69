// Forward hooks for LibTorch modules.
//
// LibTorch's C++ modules have no hooks, so the engine provides them. A module that derives
// from HookableModule routes each hookable method (forward, and any other it declares, such
// as a VAE's decode) through its HookRegistry:
//
//   pre_forward  (attach order)    may rewrite the arguments
//   the method itself
//   post_forward (reverse order)   may rewrite the result
//
// so the first hook attached wraps all the others, like nested function calls. Model code
// calls its submodules as usual and holds no offload logic; hooks are attached at run time
// to a module found by its dotted path, and detaching them restores the module exactly.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace omni::offload {

using HookArgs = std::vector<c10::IValue>;

class ModelHook {
 public:
  virtual ~ModelHook() = default;
  // Called once per (module, method) the hook is attached to.
  virtual void on_attach(torch::nn::Module& /*module*/, const std::string& /*method*/) {}
  virtual void on_detach(torch::nn::Module& /*module*/, const std::string& /*method*/) {}
  virtual void pre_forward(torch::nn::Module& /*module*/, const std::string& /*method*/,
                           HookArgs& /*args*/) {}
  virtual void post_forward(torch::nn::Module& /*module*/, const std::string& /*method*/,
                            c10::IValue& /*output*/) {}
  // Called instead of post_forward when the method (or a later hook's pre_forward) threw
  // after this hook's pre_forward succeeded, so the hook can undo what pre_forward set up.
  // The exception then propagates.
  virtual void on_forward_error(torch::nn::Module& /*module*/, const std::string& /*method*/) {}
  // Drops per-run state (e.g. between requests); the hook stays attached.
  virtual void reset() {}
};

class HookRegistry {
 public:
  using Method = std::function<c10::IValue(HookArgs&)>;

  HookRegistry(torch::nn::Module* owner, std::vector<std::string> methods);

  // Appends `hook` to the chain of `method` under `name` (unique per method).
  void attach(const std::string& method, const std::string& name, std::shared_ptr<ModelHook> hook);
  // Removes the named hook; returns false when it is not attached.
  bool detach(const std::string& method, const std::string& name);
  void detach_all();
  void reset_all();

  bool has_hooks(const std::string& method) const;
  std::vector<std::string> hook_names(const std::string& method) const;
  const std::vector<std::string>& methods() const { return methods_; }

  // Runs `impl` wrapped by the chain of `method`.
  c10::IValue run(const std::string& method, HookArgs args, const Method& impl);

 private:
  struct Entry {
    std::string method;
    std::string name;
    std::shared_ptr<ModelHook> hook;
  };
  void check_method(const std::string& method) const;

  torch::nn::Module* owner_;
  std::vector<std::string> methods_;
  std::vector<Entry> entries_;  // in attach order
};

// Base class of every module the engine may hook.
class HookableModule : public torch::nn::Module {
 public:
  explicit HookableModule(const std::string& type_name,
                          std::vector<std::string> hookable_methods = {"forward"});

  HookRegistry& hooks() { return hooks_; }
  const HookRegistry& hooks() const { return hooks_; }

 protected:
  // Calls `impl(args)` through the hooks of `method`. Subclasses write their public methods
  // as thin wrappers: pack the arguments, invoke, unpack the result.
  template <typename Impl>
  c10::IValue invoke(const char* method, HookArgs args, Impl&& impl) {
    if (!hooks_.has_hooks(method)) return impl(args);
    return hooks_.run(method, std::move(args), HookRegistry::Method(std::forward<Impl>(impl)));
  }

 private:
  HookRegistry hooks_;
};

// The module at `path` ("" = root, "transformer.blocks.3"); throws naming the path and the
// children that do exist when it is missing.
std::shared_ptr<torch::nn::Module> find_module(torch::nn::Module& root, const std::string& path);
// Same, but the module must be a HookableModule.
HookableModule& find_hookable(torch::nn::Module& root, const std::string& path);

}  // namespace omni::offload
