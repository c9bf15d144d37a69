#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

double StageAnswer::metric(const std::string& key) const {
  if (metrics == nullptr) return 0;
  const auto it = metrics->find(key);
  return it == metrics->end() ? 0.0 : it->second;
}

const StageKind* find_stage_kind(const std::string& name) {
  for (const auto* family : {&qwen3_omni_stage_kinds()}) {
    for (const auto& kind : *family) {
      if (kind.name == name) return &kind;
    }
  }
  return nullptr;
}

std::string stage_kind_names() {
  std::string names;
  for (const auto* family : {&qwen3_omni_stage_kinds()}) {
    for (const auto& kind : *family) names += (names.empty() ? "" : ", ") + kind.name;
  }
  return names;
}

}  // namespace omni::pipeline
