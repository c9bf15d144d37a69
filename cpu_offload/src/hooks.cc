#include "cpu_offload/hooks.h"

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::offload {

HookRegistry::HookRegistry(torch::nn::Module* owner, std::vector<std::string> methods)
    : owner_(owner), methods_(std::move(methods)) {}

void HookRegistry::check_method(const std::string& method) const {
  if (std::find(methods_.begin(), methods_.end(), method) != methods_.end()) return;
  std::string known;
  for (const auto& m : methods_) known += (known.empty() ? "" : ", ") + m;
  OMNI_THROW("module '", owner_->name(), "' has no hookable method '", method,
             "' (hookable: ", known, ")");
}

void HookRegistry::attach(const std::string& method, const std::string& name,
                          std::shared_ptr<ModelHook> hook) {
  check_method(method);
  OMNI_CHECK(hook != nullptr, "null hook '", name, "'");
  for (const auto& e : entries_) {
    OMNI_CHECK(!(e.method == method && e.name == name), "a hook named '", name,
               "' is already attached to ", owner_->name(), ".", method);
  }
  hook->on_attach(*owner_, method);
  entries_.push_back({method, name, std::move(hook)});
}

bool HookRegistry::detach(const std::string& method, const std::string& name) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.method == method && e.name == name; });
  if (it == entries_.end()) return false;
  Entry entry = std::move(*it);
  entries_.erase(it);
  entry.hook->on_detach(*owner_, method);
  return true;
}

void HookRegistry::detach_all() {
  // Last attached first, mirroring how they wrap each other.
  while (!entries_.empty()) {
    Entry entry = std::move(entries_.back());
    entries_.pop_back();
    entry.hook->on_detach(*owner_, entry.method);
  }
}

void HookRegistry::reset_all() {
  for (auto& e : entries_) e.hook->reset();
}

bool HookRegistry::has_hooks(const std::string& method) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.method == method; });
}

std::vector<std::string> HookRegistry::hook_names(const std::string& method) const {
  std::vector<std::string> names;
  for (const auto& e : entries_) {
    if (e.method == method) names.push_back(e.name);
  }
  return names;
}

c10::IValue HookRegistry::run(const std::string& method, HookArgs args, const Method& impl) {
  // Copy the chain: a hook may detach itself (or others) while running.
  std::vector<std::shared_ptr<ModelHook>> chain;
  for (const auto& e : entries_) {
    if (e.method == method) chain.push_back(e.hook);
  }
  size_t entered = 0;  // hooks whose pre_forward completed
  c10::IValue output;
  try {
    for (; entered < chain.size(); ++entered) chain[entered]->pre_forward(*owner_, method, args);
    output = impl(args);
  } catch (...) {
    while (entered > 0) chain[--entered]->on_forward_error(*owner_, method);
    throw;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    (*it)->post_forward(*owner_, method, output);
  }
  return output;
}

HookableModule::HookableModule(const std::string& type_name,
                               std::vector<std::string> hookable_methods)
    : torch::nn::Module(type_name), hooks_(this, std::move(hookable_methods)) {}

std::shared_ptr<torch::nn::Module> find_module(torch::nn::Module& root, const std::string& path) {
  std::shared_ptr<torch::nn::Module> current;
  torch::nn::Module* node = &root;
  size_t start = 0;
  std::string walked;
  while (start <= path.size() && !path.empty()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    std::shared_ptr<torch::nn::Module> child;
    std::string existing;
    for (const auto& item : node->named_children()) {
      if (item.key() == part) child = item.value();
      existing += (existing.empty() ? "" : ", ") + item.key();
    }
    if (!child) {
      OMNI_THROW("no module '", path, "': '", walked.empty() ? "<root>" : walked,
                 "' has no child '", part, "' (children: ", existing.empty() ? "none" : existing,
                 ")");
    }
    walked += (walked.empty() ? "" : ".") + part;
    current = child;
    node = child.get();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!current) {
    // The root itself: hand out a non-owning pointer.
    return std::shared_ptr<torch::nn::Module>(&root, [](torch::nn::Module*) {});
  }
  return current;
}

HookableModule& find_hookable(torch::nn::Module& root, const std::string& path) {
  auto module = find_module(root, path);
  auto* hookable = dynamic_cast<HookableModule*>(module.get());
  OMNI_CHECK(hookable != nullptr, "module '", path, "' (", module->name(),
             ") is not a HookableModule: the engine can only hook modules derived from "
             "omni::offload::HookableModule");
  return *hookable;
}

}  // namespace omni::offload
