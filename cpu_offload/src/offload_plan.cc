#include "cpu_offload/offload_plan.h"

#include <fnmatch.h>

#include <algorithm>

#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "cpu_offload/logging.h"
#include "module_paths.h"

namespace omni::offload {
namespace {

// Every distinct tensor of the model by name, in registration order.
struct TensorTable {
  // Carved out of every strategy's placement (OffloadConfig::resident_modules,
  // expert_modules): module paths kept resident, and module paths of expert units.
  std::vector<std::string> keep_resident;
  std::vector<std::string> experts;
  std::vector<std::string> names;
  std::unordered_map<std::string, at::Tensor> by_name;
  std::unordered_map<std::string, const void*> impl_of;  // tied weights share an impl
};

TensorTable collect_tensors(torch::nn::Module& root) {
  TensorTable table;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined() || table.by_name.count(name)) return;
    table.names.push_back(name);
    table.by_name[name] = t;
    table.impl_of[name] = t.unsafeGetTensorImpl();
  };
  for (const auto& p : root.named_parameters(/*recurse=*/true)) add(p.key(), p.value());
  for (const auto& b : root.named_buffers(/*recurse=*/true)) add(b.key(), b.value());
  return table;
}

size_t tensor_bytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Assigns tensors to buckets (-1: resident, >= 0: a unit), then makes each distinct tensor
// appear once: a tensor tied across buckets must stay resident.
class Assignment {
 public:
  explicit Assignment(const TensorTable& table) : table_(table) {
    for (const auto& n : table.names) bucket_[n] = -1;
  }
  void assign_prefix(const std::string& prefix, int bucket) {
    for (const auto& n : table_.names) {
      if (path_is_under(n, prefix)) bucket_[n] = bucket;
    }
  }
  void finish(OffloadPlan& plan, std::vector<UnitPlan*> units) {
    // Carve-outs win over the strategy: buckets <= -2 are expert units (-2 - index).
    for (const auto& path : table_.keep_resident) assign_prefix(path, -1);
    for (size_t e = 0; e < table_.experts.size(); ++e) {
      assign_prefix(table_.experts[e], -2 - static_cast<int>(e));
    }
    if (!table_.experts.empty()) {
      plan.experts.clear();
      for (const auto& path : table_.experts) plan.experts.push_back({path, {}, 0, 0});
    }
    std::map<const void*, int> impl_bucket;
    std::set<const void*> tied_across;
    for (const auto& n : table_.names) {
      const void* impl = table_.impl_of.at(n);
      auto [it, inserted] = impl_bucket.emplace(impl, bucket_[n]);
      if (!inserted && it->second != bucket_[n]) tied_across.insert(impl);
    }
    std::set<const void*> seen;
    for (const auto& n : table_.names) {
      const void* impl = table_.impl_of.at(n);
      const size_t bytes = tensor_bytes(table_.by_name.at(n));
      if (!seen.insert(impl).second) continue;
      plan.param_bytes += bytes;
      const int bucket = tied_across.count(impl) ? -1 : bucket_[n];
      if (tied_across.count(impl)) {
        log_info("tensor '", n, "' is shared by parts placed differently: kept resident");
      }
      if (bucket <= -2) {
        auto& expert = plan.experts[static_cast<size_t>(-2 - bucket)];
        expert.tensor_names.push_back(n);
        expert.bytes += bytes;
        plan.expert_bytes += bytes;
      } else if (bucket < 0) {
        plan.resident_tensors.push_back(n);
        plan.resident_bytes += bytes;
      } else {
        units[bucket]->tensor_names.push_back(n);
        units[bucket]->bytes += bytes;
      }
    }
  }

 private:
  const TensorTable& table_;
  std::unordered_map<std::string, int> bucket_;
};

std::vector<std::string> child_names(torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& c : module.named_children()) names.push_back(c.key());
  return names;
}

bool has_tensors(torch::nn::Module& module) {
  return !module.parameters(true).empty() || !module.buffers(true).empty();
}

void plan_layerwise(torch::nn::Module& root, const ModelSpec& spec, const OffloadConfig& config,
                    const TensorTable& table, OffloadPlan& plan) {
  OMNI_CHECK(!spec.block_lists.empty(),
             "layerwise offload needs block lists, but the model "
             "declares none and none were found by name");
  Assignment assignment(table);
  std::vector<std::string> order_keys;  // one per DiT (or per block list outside any DiT)
  for (const auto& list : spec.block_lists) {
    std::shared_ptr<torch::nn::Module> list_module;
    try {
      list_module = find_module(root, list.path);
    } catch (const Error& e) {
      OMNI_THROW("unknown block list '", list.path, "': ", e.what());
    }
    const auto blocks = child_names(*list_module);
    OMNI_CHECK(!blocks.empty(), "block list '", list.path, "' has no blocks");
    std::string key = list.path;
    for (const auto& dit : spec.dits) {
      if (path_is_under(list.path, dit)) key = dit;
    }
    auto it = std::find(order_keys.begin(), order_keys.end(), key);
    const int order_group = static_cast<int>(it - order_keys.begin());
    if (it == order_keys.end()) order_keys.push_back(key);

    const auto streamed = static_cast<size_t>(std::llround(config.offload_ratio * blocks.size()));
    for (size_t b = 0; b < streamed; ++b) {
      const std::string block_path = list.path + "." + blocks[b];
      if (config.granularity == Granularity::kBlock) {
        plan.units.push_back({block_path, {}, 0, order_group});
        continue;
      }
      auto block = find_module(root, block_path);
      std::vector<std::string> phases = list.phases;
      if (phases.empty()) {
        for (const auto& c : block->named_children()) {
          if (has_tensors(*c.value())) phases.push_back(c.key());
        }
      }
      OMNI_CHECK(!phases.empty(), "phase granularity: block '", block_path,
                 "' has no child modules holding weights to use as phases");
      for (const auto& phase : phases) {
        find_module(root, block_path + "." + phase);  // throws naming a missing phase
        plan.units.push_back({block_path + "." + phase, {}, 0, order_group});
      }
    }
  }
  std::vector<UnitPlan*> units;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    assignment.assign_prefix(plan.units[i].name, static_cast<int>(i));
    units.push_back(&plan.units[i]);
  }
  assignment.finish(plan, units);
}

void plan_model_level(torch::nn::Module& root, const ModelSpec& spec, const OffloadConfig& config,
                      const TensorTable& table, OffloadPlan& plan) {
  for (const auto& path : spec.dits) find_module(root, path);
  for (const auto& path : spec.encoders) find_module(root, path);
  for (const auto& path : spec.vaes) find_module(root, path);
  if (spec.encoders.empty() && spec.dits.size() < 2) {
    log_warning("model-level offload: the model has no encoders and ", spec.dits.size(),
                " DiT(s), so there is nothing to alternate with; keeping "
                "every weight resident (use layerwise offload to save memory on such a model)");
    plan.strategy = Strategy::kNone;
    Assignment assignment(table);
    assignment.finish(plan, {});
    return;
  }
  if (!spec.encoders.empty()) plan.groups.push_back({"encoders", {}, 0});
  for (const auto& dit : spec.dits) plan.groups.push_back({dit, {}, 0});
  if (config.strict_vae) {
    for (const auto& vae : spec.vaes) plan.groups.push_back({vae, {}, 0});
  }
  for (auto& group : plan.groups) {
    if (group.name == "encoders") {
      for (const auto& e : spec.encoders) group.units.push_back({e, {}, 0, 0});
    } else {
      group.units.push_back({group.name, {}, 0, 0});
    }
  }
  Assignment assignment(table);
  std::vector<UnitPlan*> units;
  for (auto& group : plan.groups) {
    for (auto& unit : group.units) {
      assignment.assign_prefix(unit.name, static_cast<int>(units.size()));
      units.push_back(&unit);
    }
  }
  assignment.finish(plan, units);
  for (auto& group : plan.groups) {
    for (const auto& unit : group.units) group.bytes += unit.bytes;
  }
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? dot : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// "thinker.*" matches "thinker.visual" but not "thinker" nor "thinker.visual.blocks".
bool matches_pattern(const std::string& pattern, const std::string& path) {
  const auto p = split_path(pattern);
  const auto q = split_path(path);
  if (p.size() != q.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (fnmatch(p[i].c_str(), q[i].c_str(), 0) != 0) return false;
  }
  return true;
}

void plan_components(torch::nn::Module& root, const OffloadConfig& config, const TensorTable& table,
                     OffloadPlan& plan) {
  std::vector<std::string> matched;
  for (const auto& pattern : config.components) {
    size_t found = 0;
    for (const auto& item : root.named_modules("", /*include_self=*/false)) {
      if (!matches_pattern(pattern, item.key())) continue;
      ++found;
      if (std::find(matched.begin(), matched.end(), item.key()) == matched.end()) {
        matched.push_back(item.key());
      }
    }
    if (found == 0) {
      std::string top;
      for (const auto& c : root.named_children()) top += (top.empty() ? "" : ", ") + c.key();
      OMNI_THROW("component pattern '", pattern,
                 "' matches no module (top-level modules: ", top.empty() ? "none" : top, ")");
    }
  }
  // A component inside another matched one belongs to the outer one.
  for (const auto& path : matched) {
    const bool nested = std::any_of(matched.begin(), matched.end(), [&](const std::string& o) {
      return o != path && path_is_under(path, o);
    });
    if (!nested) plan.units.push_back({path, {}, 0, 0});
  }
  Assignment assignment(table);
  std::vector<UnitPlan*> units;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    assignment.assign_prefix(plan.units[i].name, static_cast<int>(i));
    units.push_back(&plan.units[i]);
  }
  assignment.finish(plan, units);
}

// Modules matching any of `patterns` (outermost matches only), in module order. A pattern that
// matches nothing is an error naming `what`.
std::vector<std::string> matched_modules(torch::nn::Module& root,
                                         const std::vector<std::string>& patterns,
                                         const char* what) {
  if (patterns.empty()) return {};
  std::vector<std::string> matched;
  std::vector<size_t> found(patterns.size(), 0);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    bool hit = false;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (matches_pattern(patterns[i], item.key())) {
        ++found[i];
        hit = true;
      }
    }
    if (!hit) continue;
    const bool nested = std::any_of(matched.begin(), matched.end(), [&](const std::string& o) {
      return path_is_under(item.key(), o);
    });
    if (!nested) matched.push_back(item.key());
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    OMNI_CHECK(found[i] > 0, what, " pattern '", patterns[i], "' matches no module");
  }
  return matched;
}

}  // namespace

OffloadPlan make_offload_plan(torch::nn::Module& root, const ModelSpec& spec,
                              const OffloadConfig& config) {
  config.validate();
  OffloadPlan plan;
  plan.strategy = config.strategy();
  TensorTable table = collect_tensors(root);
  table.keep_resident = matched_modules(root, config.resident_modules, "resident module");
  table.experts = matched_modules(root, config.expert_modules, "expert module");
  switch (plan.strategy) {
    case Strategy::kNone: {
      Assignment assignment(table);
      assignment.finish(plan, {});
      break;
    }
    case Strategy::kLayerwise:
      plan_layerwise(root, spec, config, table, plan);
      break;
    case Strategy::kModelLevel:
      plan_model_level(root, spec, config, table, plan);
      break;
    case Strategy::kComponent:
      plan_components(root, config, table, plan);
      break;
  }
  return plan;
}

std::string OffloadPlan::describe() const {
  std::string out = detail::str_cat("strategy ", to_string(strategy), ": ", resident_tensors.size(),
                                    " resident tensors (", resident_bytes, " bytes)");
  if (!units.empty()) out += detail::str_cat(", ", units.size(), " streamed units");
  if (!experts.empty()) {
    out += detail::str_cat(", ", experts.size(), " experts (", expert_bytes, " bytes)");
  }
  for (const auto& g : groups) {
    out +=
        detail::str_cat(", group ", g.name, " (", g.units.size(), " units, ", g.bytes, " bytes)");
  }
  return out;
}

}  // namespace omni::offload
