// Loading a diffusers QwenImagePipeline folder and checking that its parts fit together: a
// folder whose parts disagree (latent channels, text width) would otherwise fail deep in a
// forward.
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "model_index.h"
#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

// model_index.json's class, and the parts it needs present.
QwenImageVariant read_model_index(const std::string& dir) {
  const auto index = load_model_index(dir);
  const std::string& path = index.source();
  const auto cls = index.get_string("_class_name");
  QwenImageVariant variant = QwenImageVariant::kTextToImage;
  if (cls == "QwenImageEditPipeline") {
    variant = QwenImageVariant::kEdit;
  } else if (cls == "QwenImageEditPlusPipeline") {
    variant = QwenImageVariant::kEditPlus;
  } else {
    OMNI_CHECK(cls == "QwenImagePipeline", path,
               ": _class_name must be QwenImagePipeline, QwenImageEditPipeline or "
               "QwenImageEditPlusPipeline, got '",
               cls, "'");
  }
  std::vector<const char*> parts = {"tokenizer", "text_encoder", "transformer", "vae", "scheduler"};
  if (variant != QwenImageVariant::kTextToImage) parts.push_back("processor");
  for (const char* part : parts) {
    OMNI_CHECK(component_present(index, part), path, ": field '", part, "' is missing or null; ",
               cls, " needs it");
    require_folder(dir, part);
  }
  return variant;
}

// Qwen2VLImageProcessor's defaults under the processor's own preprocessor_config.json.
VisionPatchOptions edit_processor_options(const std::string& dir,
                                          const qwen2_5::VisionConfig& tower) {
  VisionPatchOptions defaults;
  defaults.patch_size = 14;
  defaults.merge_size = 2;
  defaults.temporal_patch_size = 2;
  defaults.min_pixels = 56 * 56;
  defaults.max_pixels = 28 * 28 * 1280;
  defaults.image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  defaults.image_std = {0.26862954, 0.26130258, 0.27577711};
  const auto file = (fs::path(dir) / "processor" / "preprocessor_config.json").string();
  OMNI_CHECK(fs::exists(file), file, " is missing: the Edit pipelines read the image ",
             "processor's settings from it");
  const auto options = vision_options_from_preprocessor_config(file, defaults);
  OMNI_CHECK(options.patch_size == tower.patch_size &&
                 options.merge_size == tower.spatial_merge_size &&
                 options.temporal_patch_size == tower.temporal_patch_size,
             file, ": patch_size ", options.patch_size, ", merge_size ", options.merge_size,
             " and temporal_patch_size ", options.temporal_patch_size,
             " must be the text encoder's vision_config patch_size ", tower.patch_size,
             ", spatial_merge_size ", tower.spatial_merge_size, " and temporal_patch_size ",
             tower.temporal_patch_size);
  return options;
}

}  // namespace

QwenImagePipeline::QwenImagePipeline(std::string dir, QwenImageVariant variant,
                                     QwenImageTokenizer tokenizer,
                                     std::shared_ptr<qwen2_5::TextDecoder> text_encoder,
                                     std::shared_ptr<qwen2_5::VisionTower> visual,
                                     QwenImageVisionEncoder vision,
                                     std::shared_ptr<QwenImageTransformer2DModel> transformer,
                                     std::shared_ptr<AutoencoderKLWan> vae)
    : dir_(std::move(dir)),
      variant_(variant),
      tokenizer_(std::move(tokenizer)),
      text_encoder_(register_module("text_encoder", std::move(text_encoder))),
      vision_(vision) {
  OMNI_CHECK((visual != nullptr) == (variant != QwenImageVariant::kTextToImage),
             "QwenImagePipeline: the vision tower belongs to the edit variants, and only them");
  if (visual) visual_ = register_module("visual", std::move(visual));
  vision_.tower = visual_.get();
  transformer_ = register_module("transformer", std::move(transformer));
  vae_ = register_module("vae", std::move(vae));
}

offload::ModelSpec QwenImagePipeline::offload_spec() const {
  offload::ModelSpec spec;
  spec.dits = {"transformer"};
  spec.encoders = {"text_encoder"};
  if (visual_) spec.encoders.push_back("visual");
  spec.vaes = {"vae"};
  spec.block_lists.push_back({std::string("transformer.") + QwenImageTransformer2DModel::kBlocks,
                              QwenImageTransformer2DModel::block_phases()});
  return spec;
}

std::unique_ptr<FlowMatchEulerScheduler> QwenImagePipeline::make_scheduler() const {
  const auto path = (fs::path(dir_) / "scheduler" / "scheduler_config.json").string();
  return std::make_unique<FlowMatchEulerScheduler>(
      FlowMatchEulerScheduler::parse_config(HfConfig::load(path)));
}

std::shared_ptr<QwenImagePipeline> load_qwen_image_pipeline(const std::string& dir,
                                                            at::ScalarType dtype) {
  const auto variant = read_model_index(dir);
  const auto sub = [&](const char* name) { return (fs::path(dir) / name).string(); };
  // The scheduler first: a bad scheduler_config.json fails before the weights load.
  const auto scheduler_path = sub("scheduler") + "/scheduler_config.json";
  const auto scheduler_json = HfConfig::load(scheduler_path);
  const auto cls = scheduler_json.get_string("_class_name");
  OMNI_CHECK(cls == "FlowMatchEulerDiscreteScheduler", scheduler_path,
             ": _class_name must be FlowMatchEulerDiscreteScheduler (the pipeline passes sigmas "
             "and mu), got '",
             cls, "'");
  FlowMatchEulerScheduler::parse_config(scheduler_json);
  const auto text_config = qwen2_5::TextConfig::load(sub("text_encoder"));
  const auto vae_config = WanVAEConfig::load(sub("vae"));
  const auto t_config = QwenImageTransformerConfig::load(sub("transformer"));
  OMNI_CHECK(t_config.in_channels == 4 * vae_config.z_dim, dir,
             "/transformer/config.json: in_channels ", t_config.in_channels,
             " != 4 x vae/config.json z_dim ", vae_config.z_dim, " (2 x 2 packed latents)");
  OMNI_CHECK(t_config.out_channels == vae_config.z_dim && t_config.patch_size == 2, dir,
             "/transformer/config.json: out_channels ", t_config.out_channels, " and patch_size ",
             t_config.patch_size, " must be vae/config.json z_dim ", vae_config.z_dim, " and 2");
  OMNI_CHECK(vae_config.scale_factor_spatial == 8, dir,
             "/vae/config.json: the pipeline packs 8x-downsampled latents, this VAE downsamples ",
             vae_config.scale_factor_spatial, "x");
  OMNI_CHECK(t_config.joint_attention_dim == text_config.hidden_size, dir,
             "/transformer/config.json: joint_attention_dim ", t_config.joint_attention_dim,
             " != text_encoder/config.json hidden_size ", text_config.hidden_size);
  auto tokenizer = QwenImageTokenizer::load(sub("tokenizer"));
  auto text_encoder = qwen2_5::load_text_decoder(sub("text_encoder"), dtype);
  auto vae = load_wan_vae(sub("vae"), dtype);
  auto transformer = load_qwen_image_transformer(sub("transformer"), dtype);
  std::shared_ptr<qwen2_5::VisionTower> visual;
  QwenImageVisionEncoder vision;
  if (variant != QwenImageVariant::kTextToImage) {
    // The tower lies in text_encoder/ beside the decoder (visual.*).
    visual = qwen2_5::load_vision_tower(sub("text_encoder"), dtype);
    vision.tokens = qwen2_5::ImageTokenIds::load(sub("text_encoder"));
    vision.options = edit_processor_options(dir, visual->config());
    OMNI_CHECK(visual->config().out_hidden_size == text_config.hidden_size, dir,
               "/text_encoder/config.json: vision_config out_hidden_size ",
               visual->config().out_hidden_size, " != the decoder's hidden_size ",
               text_config.hidden_size);
  }
  return std::make_shared<QwenImagePipeline>(dir, variant, std::move(tokenizer),
                                             std::move(text_encoder), std::move(visual), vision,
                                             std::move(transformer), std::move(vae));
}

}  // namespace omni::models
