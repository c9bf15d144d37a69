#include "worker/pipeline/stage_kind.h"

#include "worker/pipeline/model_family.h"

namespace omni::pipeline {

double StageAnswer::metric(const std::string& key) const {
  if (metrics == nullptr) return 0;
  const auto it = metrics->find(key);
  return it == metrics->end() ? 0.0 : it->second;
}

const StageKind* find_stage_kind(const std::string& name) {
  for (const ModelFamily* family : model_families()) {
    for (const auto& kind : family->stage_kinds()) {
      if (kind.name == name) return &kind;
    }
  }
  return nullptr;
}

std::string stage_kind_names() {
  std::string names;
  for (const ModelFamily* family : model_families()) {
    for (const auto& kind : family->stage_kinds()) names += (names.empty() ? "" : ", ") + kind.name;
  }
  return names;
}

const Handoff* find_handoff(const std::string& name) {
  const std::string last =
      name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
  for (const ModelFamily* family : model_families()) {
    for (const auto& h : family->handoffs()) {
      if (h.name == last) return &h;
    }
  }
  return nullptr;
}

const Handoff* default_handoff(const std::string& from, const std::string& to) {
  for (const ModelFamily* family : model_families()) {
    for (const auto& h : family->handoffs()) {
      if (h.from == from && h.to == to) return &h;
    }
  }
  return nullptr;
}

std::string handoff_names() {
  std::string names;
  for (const ModelFamily* family : model_families()) {
    for (const auto& h : family->handoffs()) names += (names.empty() ? "" : ", ") + h.name;
  }
  return names;
}

}  // namespace omni::pipeline
