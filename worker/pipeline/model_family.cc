#include "worker/pipeline/model_family.h"

#include <mutex>

#include "cpu_offload/check.h"

namespace omni::pipeline {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<ModelFamily>> families;
};

// Constructed on first use: families register while static objects are constructed.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const std::vector<Handoff>& ModelFamily::handoffs() const {
  static const std::vector<Handoff> none;
  return none;
}

bool ModelFamily::claims_checkpoint(const std::string&) const { return false; }

config::PipelineConfig ModelFamily::checkpoint_graph(const CheckpointGraphOptions& o) const {
  OMNI_THROW("model family ", name(), " has no default stage graph for ", o.where,
             ": pass --stage-configs-path");
}

std::optional<VideoDefaults> ModelFamily::video_defaults(const std::string&) const {
  return std::nullopt;
}

std::optional<ImageDefaults> ModelFamily::image_defaults(const std::string&) const {
  return std::nullopt;
}

void ModelFamily::apply_sampling_defaults(const config::StageConfig&, const std::set<std::string>&,
                                          Request&) const {}

void register_model_family(std::unique_ptr<ModelFamily> family) {
  OMNI_CHECK(family != nullptr, "register_model_family: no family");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& other : r.families) {
    OMNI_CHECK(other->name() != family->name(), "model family ", family->name(),
               " is registered twice");
    for (const auto& kind : family->stage_kinds()) {
      for (const auto& known : other->stage_kinds()) {
        OMNI_CHECK(kind.name != known.name, "stage kind '", kind.name, "' of model family ",
                   family->name(), " is already registered by ", other->name());
      }
    }
    for (const auto& h : family->handoffs()) {
      for (const auto& known : other->handoffs()) {
        OMNI_CHECK(h.name != known.name, "hand-off '", h.name, "' of model family ", family->name(),
                   " is already registered by ", other->name());
      }
    }
  }
  for (const auto& kind : family->stage_kinds()) config::add_model_stage_name(kind.name);
  r.families.push_back(std::move(family));
}

std::vector<const ModelFamily*> model_families() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const ModelFamily*> out;
  for (const auto& f : r.families) out.push_back(f.get());
  return out;
}

const ModelFamily* family_of_kind(const std::string& model_stage) {
  for (const ModelFamily* f : model_families()) {
    for (const auto& kind : f->stage_kinds()) {
      if (kind.name == model_stage) return f;
    }
  }
  return nullptr;
}

const ModelFamily& family_of_checkpoint(const std::string& model_dir) {
  std::vector<const ModelFamily*> claimed;
  std::string markers;
  for (const ModelFamily* f : model_families()) {
    if (f->claims_checkpoint(model_dir)) claimed.push_back(f);
    if (!f->checkpoint_marker().empty()) {
      markers += (markers.empty() ? "" : "; ") + f->name() + ": " + f->checkpoint_marker();
    }
  }
  if (claimed.empty()) {
    OMNI_THROW("'", model_dir, "' is no checkpoint folder a model family reads (",
               markers.empty() ? "no family reads checkpoint folders" : markers, ")");
  }
  if (claimed.size() > 1) {
    std::string names;
    for (const ModelFamily* f : claimed) names += (names.empty() ? "" : ", ") + f->name();
    OMNI_THROW("'", model_dir, "' is a checkpoint of more than one model family (", names,
               "): pass --stage-configs-path to choose its stages");
  }
  return *claimed.front();
}

config::StageConfig checkpoint_stage(const CheckpointGraphOptions& o, int64_t id,
                                     const std::string& model_stage, std::vector<int64_t> sources,
                                     const std::string& final_output_type) {
  config::StageConfig s;
  s.stage_id = id;
  s.runtime.devices = o.devices;
  s.engine.model_stage = model_stage;
  s.engine.model = o.model_dir;
  s.engine.dtype = o.dtype;
  s.engine_input_source = std::move(sources);
  s.final_output = !final_output_type.empty();
  s.final_output_type = final_output_type;
  s.location = {o.where, 0, 0};
  return s;
}

}  // namespace omni::pipeline
