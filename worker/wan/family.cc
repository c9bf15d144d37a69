// The Wan family (a diffusers Wan folder): its stage kinds, `diffusion`, an entry stage that
// turns the request's prompt (and image) into video frames (diffusion_stage.cc), and the same as
// three stages, diffusion_encode -> diffusion_denoise -> diffusion_decode
// (diffusion_split_stages.cc). Step packets become on_progress calls, the frames of the last
// packet the result's video.
#include "model_runner/diffusion/wan_pipeline.h"
#include "worker/diffusers/diffusers_folder.h"
#include "worker/diffusers/diffusion_stage_common.h"
#include "worker/pipeline/model_family.h"
#include "worker/pipeline/pipeline.h"
#include "worker/wan/payloads.h"
#include "worker/wan/stages.h"

namespace omni::pipeline {
namespace {

// A step packet: the progress count and callback.
bool collect_step(const StagePacket& p, StageAnswer& a) {
  if (!a.primary || !p.metrics.count("step")) return true;
  ++a.result.progress_packets;
  return !a.callbacks.on_progress || a.callbacks.on_progress(p.metrics);
}

// The last packet: its frames are the video (another branch's go to branch_outputs).
bool collect_frames(const StagePacket& p, StageAnswer& a) {
  if (!p.finished) return true;
  auto& r = a.result;
  const auto video = payload_as<VideoFrames>(p, &VideoFrames::read);
  const at::Tensor frames = video ? video->frames : at::Tensor();
  if (!a.primary) {
    if (frames.defined()) r.branch_outputs[a.stage] = frames;
    return true;
  }
  if (frames.defined()) r.video = frames;
  r.finish_reason = p.finish_reason;
  return true;
}

void finish_video(StageAnswer& a) {
  if (!a.primary) return;
  a.result.video_fps = static_cast<int64_t>(a.metric("fps"));
}

StageKind diffusion() {
  StageKind k;
  k.name = "diffusion";
  k.answers_video = true;
  k.params = &diffusion_stage_params;
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    return p.finished ? collect_frames(p, a) : collect_step(p, a);
  };
  k.finish = &finish_video;
  k.make_local = &local::make_diffusion_stage;
  k.ignored_keys = diffusion_ignored_keys(/*batched=*/true);
  return k;
}

StageKind diffusion_encode() {
  StageKind k;
  k.name = "diffusion_encode";
  k.params = &diffusion_stage_params;
  k.collect = [](const StagePacket&, StageAnswer&) { return true; };
  k.make_local = &local::make_diffusion_encode_stage;
  k.ignored_keys = diffusion_ignored_keys();
  return k;
}

StageKind diffusion_denoise() {
  StageKind k;
  k.name = "diffusion_denoise";
  k.reads = {"diffusion_encode"};
  k.params = &diffusion_stage_params;
  k.collect = &collect_step;
  k.make_local = &local::make_diffusion_denoise_stage;
  k.ignored_keys = diffusion_ignored_keys();
  return k;
}

StageKind diffusion_decode() {
  StageKind k;
  k.name = "diffusion_decode";
  k.reads = {"diffusion_denoise"};
  k.answers_video = true;
  k.params = &diffusion_stage_params;
  k.collect = &collect_frames;
  k.finish = &finish_video;
  k.make_local = &local::make_diffusion_decode_stage;
  k.ignored_keys = diffusion_ignored_keys();
  return k;
}

class WanFamily : public ModelFamily {
 public:
  std::string name() const override { return "wan"; }

  const std::vector<StageKind>& stage_kinds() const override {
    static const std::vector<StageKind> kinds = {diffusion(), diffusion_encode(),
                                                 diffusion_denoise(), diffusion_decode()};
    return kinds;
  }

  // Wan's pipelines (WanPipeline; WanImageToVideoPipeline, which the loader refuses by name),
  // and a folder whose model_index.json names no class, as before other diffusion families.
  bool claims_checkpoint(const std::string& model_dir) const override {
    if (!is_diffusers_folder(model_dir)) return false;
    const std::string cls = diffusers_pipeline_class(model_dir);
    return cls.empty() || cls.rfind("Wan", 0) == 0;
  }
  std::string checkpoint_marker() const override { return "model_index.json"; }

  // As vLLM-Omni: one diffusion stage, one request at a time, answering with images.
  config::PipelineConfig checkpoint_graph(const CheckpointGraphOptions& o) const override {
    config::PipelineConfig c;
    c.path = o.where;
    auto s = checkpoint_stage(o, 0, "diffusion", {}, "image");
    s.stage_type = "diffusion";
    s.runtime.max_batch_size = 1;
    c.stages.push_back(std::move(s));
    return c;
  }

  // The folder's frame rate, and the pipeline's own defaults for what a request leaves unset.
  std::optional<VideoDefaults> video_defaults(const std::string& model_dir) const override {
    const models::WanRequest defaults;
    VideoDefaults v;
    v.fps = diffusers_frame_rate(model_dir);
    v.width = defaults.width;
    v.height = defaults.height;
    v.frames = defaults.num_frames;
    v.steps = defaults.num_inference_steps;
    return v;
  }
};

const RegisterModelFamily<WanFamily> registered;

}  // namespace

}  // namespace omni::pipeline
