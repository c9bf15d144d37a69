// The Qwen-Image family (a diffusers QwenImagePipeline, QwenImageEditPipeline or
// QwenImageEditPlusPipeline folder): its stage kind `qwen_image`, an entry stage that turns the
// request's prompt (and the images to edit) into images (image_stage.cc). Step packets become
// on_progress calls, the images of the last packet the result's images.
#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "worker/diffusers/diffusers_folder.h"
#include "worker/diffusers/diffusion_stage_common.h"
#include "worker/pipeline/model_family.h"
#include "worker/pipeline/pipeline.h"
#include "worker/qwen_image/image_stage.h"

namespace omni::pipeline {
namespace {

bool collect(const StagePacket& p, StageAnswer& a) {
  if (!p.finished) {
    if (!a.primary || !p.metrics.count("step")) return true;
    ++a.result.progress_packets;
    return !a.callbacks.on_progress || a.callbacks.on_progress(p.metrics);
  }
  const auto still = payload_as<StillImages>(p, &StillImages::read);
  const at::Tensor images = still ? still->images : at::Tensor();
  if (!a.primary) {
    if (images.defined()) a.result.branch_outputs[a.stage] = images;
    return true;
  }
  if (images.defined()) a.result.images = images;
  a.result.finish_reason = p.finish_reason;
  return true;
}

StageKind image_stage() {
  StageKind k;
  k.name = "qwen_image";
  k.answers_images = true;
  k.params = &diffusion_stage_params;
  k.collect = &collect;
  k.make_local = &local::make_image_stage;
  k.ignored_keys = diffusion_ignored_keys();
  return k;
}

// The most images one Edit-Plus request may give.
constexpr int64_t kMaxEditImages = 4;

class QwenImageFamily : public ModelFamily {
 public:
  std::string name() const override { return "qwen_image"; }

  const std::vector<StageKind>& stage_kinds() const override {
    static const std::vector<StageKind> kinds = {image_stage()};
    return kinds;
  }

  bool claims_checkpoint(const std::string& model_dir) const override {
    // QwenImagePipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline (others the loader
    // refuses by name).
    return diffusers_pipeline_class(model_dir).rfind("QwenImage", 0) == 0;
  }
  std::string checkpoint_marker() const override {
    return "model_index.json naming QwenImagePipeline or QwenImageEdit(Plus)Pipeline";
  }

  // As vLLM-Omni: one diffusion stage, one request at a time, answering with images.
  config::PipelineConfig checkpoint_graph(const CheckpointGraphOptions& o) const override {
    config::PipelineConfig c;
    c.path = o.where;
    auto s = checkpoint_stage(o, 0, "qwen_image", {}, "image");
    s.stage_type = "diffusion";
    s.runtime.max_batch_size = 1;
    c.stages.push_back(std::move(s));
    return c;
  }

  // The pipeline's own size for a request that names none (an edit's default is its image's
  // size at the same area), and the images an edit takes: Edit one, Edit-Plus up to
  // kMaxEditImages (the model card's 1 to 3, and one more).
  std::optional<ImageDefaults> image_defaults(const std::string& model_dir) const override {
    const std::string cls = diffusers_pipeline_class(model_dir);
    const int64_t images = cls == "QwenImageEditPipeline"       ? 1
                           : cls == "QwenImageEditPlusPipeline" ? kMaxEditImages
                                                                : 0;
    return ImageDefaults{models::kQwenImageDefaultSize, models::kQwenImageDefaultSize, images};
  }
};

const RegisterModelFamily<QwenImageFamily> registered;

}  // namespace
}  // namespace omni::pipeline
