// Loading a diffusers QwenImagePipeline folder and checking that its parts fit together: a
// folder whose parts disagree (latent channels, text width) would otherwise fail deep in a
// forward.
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "cpu_offload/check.h"
#include "model_index.h"
#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

void read_model_index(const std::string& dir) {
  const auto index = load_model_index(dir);
  const std::string& path = index.source();
  const auto cls = index.get_string("_class_name");
  OMNI_CHECK(cls.rfind("QwenImageEdit", 0) != 0, path, ": _class_name ", cls,
             " is not supported yet (Qwen-Image-Edit needs the Qwen2.5-VL vision tower and the "
             "condition image's latents); QwenImagePipeline folders are");
  OMNI_CHECK(cls == "QwenImagePipeline", path, ": _class_name must be QwenImagePipeline, got '",
             cls, "'");
  for (const char* part : {"tokenizer", "text_encoder", "transformer", "vae", "scheduler"}) {
    OMNI_CHECK(component_present(index, part), path, ": field '", part,
               "' is missing or null; QwenImagePipeline needs it");
    require_folder(dir, part);
  }
}

}  // namespace

QwenImagePipeline::QwenImagePipeline(std::string dir, QwenImageTokenizer tokenizer,
                                     std::shared_ptr<qwen2_5::TextDecoder> text_encoder,
                                     std::shared_ptr<QwenImageTransformer2DModel> transformer,
                                     std::shared_ptr<AutoencoderKLWan> vae)
    : dir_(std::move(dir)),
      tokenizer_(std::move(tokenizer)),
      text_encoder_(register_module("text_encoder", std::move(text_encoder))),
      transformer_(register_module("transformer", std::move(transformer))),
      vae_(register_module("vae", std::move(vae))) {}

offload::ModelSpec QwenImagePipeline::offload_spec() const {
  offload::ModelSpec spec;
  spec.dits = {"transformer"};
  spec.encoders = {"text_encoder"};
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
  read_model_index(dir);
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
  return std::make_shared<QwenImagePipeline>(dir, std::move(tokenizer), std::move(text_encoder),
                                             std::move(transformer), std::move(vae));
}

}  // namespace omni::models
