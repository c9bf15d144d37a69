#include "cpu_offload/model_spec.h"

#include <algorithm>

#include "cpu_offload/logging.h"

namespace omni::offload {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

ModelSpec resolve_model_spec(torch::nn::Module& root, const ModelSpec& declared) {
  if (declared.has_components()) return declared;

  static const std::vector<std::string> kDitNames = {"transformer", "transformer_2", "dit",
                                                     "language_model", "model"};
  static const std::vector<std::string> kBlockListNames = {"blocks", "transformer_blocks",
                                                           "single_transformer_blocks", "layers"};
  ModelSpec spec = declared;
  for (const auto& child : root.named_children()) {
    const std::string& name = child.key();
    if (contains(kDitNames, name)) {
      spec.dits.push_back(name);
    } else if (name.rfind("text_encoder", 0) == 0 || name == "image_encoder") {
      spec.encoders.push_back(name);
    } else if (name == "vae") {
      spec.vaes.push_back(name);
    }
  }
  if (declared.block_lists.empty()) {
    for (const auto& dit : spec.dits) {
      for (const auto& child : root.named_children()[dit]->named_children()) {
        if (contains(kBlockListNames, child.key())) {
          spec.block_lists.push_back({dit + "." + child.key(), {}});
        }
      }
    }
  }
  std::vector<std::string> lists;
  for (const auto& b : spec.block_lists) lists.push_back(b.path);
  log_warning("model declares no offload components; found by name: dits [", join(spec.dits),
              "], encoders [", join(spec.encoders), "], vae [", join(spec.vaes), "], block lists [",
              join(lists), "]");
  return spec;
}

}  // namespace omni::offload
