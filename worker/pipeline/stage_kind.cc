#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

double StageAnswer::metric(const std::string& key) const {
  if (metrics == nullptr) return 0;
  const auto it = metrics->find(key);
  return it == metrics->end() ? 0.0 : it->second;
}

const StageKind* find_stage_kind(const std::string& name) {
  for (const auto* family : {&qwen3_omni_stage_kinds(), &diffusion_stage_kinds()}) {
    for (const auto& kind : *family) {
      if (kind.name == name) return &kind;
    }
  }
  return nullptr;
}

std::string stage_kind_names() {
  std::string names;
  for (const auto* family : {&qwen3_omni_stage_kinds(), &diffusion_stage_kinds()}) {
    for (const auto& kind : *family) names += (names.empty() ? "" : ", ") + kind.name;
  }
  return names;
}

const Handoff* find_handoff(const std::string& name) {
  const std::string last =
      name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
  for (const auto* family : {&qwen3_omni_handoffs()}) {
    for (const auto& h : *family) {
      if (h.name == last) return &h;
    }
  }
  return nullptr;
}

const Handoff* default_handoff(const std::string& from, const std::string& to) {
  for (const auto* family : {&qwen3_omni_handoffs()}) {
    for (const auto& h : *family) {
      if (h.from == from && h.to == to) return &h;
    }
  }
  return nullptr;
}

std::string handoff_names() {
  std::string names;
  for (const auto* family : {&qwen3_omni_handoffs()}) {
    for (const auto& h : *family) names += (names.empty() ? "" : ", ") + h.name;
  }
  return names;
}

}  // namespace omni::pipeline
