// Loading a diffusers WanPipeline folder and checking that its parts fit together: a folder
// whose parts disagree (latent channels, text width) would otherwise fail deep in a forward.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cpu_offload/check.h"
#include "model_index.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

WanPipelineConfig read_model_index(const std::string& dir) {
  const auto index = load_model_index(dir);
  const std::string& path = index.source();
  const auto cls = index.get_string("_class_name");
  OMNI_CHECK(cls != "WanImageToVideoPipeline", path,
             ": _class_name WanImageToVideoPipeline is not ",
             "supported (Wan2.1 / Wan2.2-A14B image-to-video); WanPipeline folders are, TI2V-5B's ",
             "image-to-video included");
  OMNI_CHECK(cls == "WanPipeline", path, ": _class_name must be WanPipeline, got '", cls, "'");
  WanPipelineConfig config;
  if (index.has("boundary_ratio")) config.boundary_ratio = index.get_double("boundary_ratio");
  config.expand_timesteps = index.get_bool("expand_timesteps", false);
  for (const char* part : {"tokenizer", "text_encoder", "transformer", "vae", "scheduler"}) {
    OMNI_CHECK(component_present(index, part), path, ": field '", part,
               "' is missing or null; WanPipeline needs it");
    require_folder(dir, part);
  }
  config.has_transformer_2 = component_present(index, "transformer_2");
  if (config.has_transformer_2) require_folder(dir, "transformer_2");
  OMNI_CHECK(!config.boundary_ratio || config.has_transformer_2, path,
             ": boundary_ratio is set but transformer_2 is null (the low-noise expert it switches "
             "to)");
  return config;
}

// The parts must agree on the latent channels and the text width; checked on the configs,
// before any weight loads.
void check_fit(const std::string& dir, const UMT5Config& text_encoder,
               const WanTransformerConfig& t, const std::string& transformer_name,
               const WanVAEConfig& vae) {
  OMNI_CHECK(t.in_channels == vae.z_dim, dir, "/", transformer_name, "/config.json: in_channels ",
             t.in_channels, " != vae/config.json z_dim ", vae.z_dim);
  OMNI_CHECK(t.out_channels == vae.z_dim, dir, "/", transformer_name, "/config.json: out_channels ",
             t.out_channels, " != vae/config.json z_dim ", vae.z_dim);
  OMNI_CHECK(t.text_dim == text_encoder.d_model, dir, "/", transformer_name,
             "/config.json: text_dim ", t.text_dim, " != text_encoder/config.json d_model ",
             text_encoder.d_model);
}

}  // namespace

WanPipeline::WanPipeline(std::string dir, WanPipelineConfig config, Tokenizer tokenizer,
                         std::shared_ptr<UMT5Encoder> text_encoder,
                         std::shared_ptr<WanTransformer3DModel> transformer,
                         std::shared_ptr<WanTransformer3DModel> transformer_2,
                         std::shared_ptr<AutoencoderKLWan> vae)
    : dir_(std::move(dir)),
      config_(config),
      tokenizer_(std::move(tokenizer)),
      text_encoder_(register_module("text_encoder", std::move(text_encoder))),
      transformer_(register_module("transformer", std::move(transformer))),
      vae_(register_module("vae", std::move(vae))) {
  // Registered after `transformer` so the children keep diffusers' offload order.
  if (transformer_2) transformer_2_ = register_module("transformer_2", std::move(transformer_2));
  config_.has_transformer_2 = transformer_2_ != nullptr;
}

offload::ModelSpec WanPipeline::offload_spec() const {
  offload::ModelSpec spec;
  spec.dits = {"transformer"};
  if (transformer_2_) spec.dits.push_back("transformer_2");
  spec.encoders = {"text_encoder"};
  spec.vaes = {"vae"};
  for (const auto& dit : spec.dits) {
    spec.block_lists.push_back({dit + ".blocks", {"attn1", "attn2", "ffn"}});
  }
  return spec;
}

std::unique_ptr<FlowScheduler> WanPipeline::make_scheduler(std::optional<double> flow_shift) const {
  const std::string path = (fs::path(dir_) / "scheduler" / "scheduler_config.json").string();
  if (!flow_shift) return load_flow_scheduler(path);
  const auto json = HfConfig::load(path);
  const auto cls = json.get_string("_class_name");
  if (cls == "UniPCMultistepScheduler") {
    auto c = UniPCMultistepScheduler::parse_config(json);
    c.flow_shift = *flow_shift;
    return std::make_unique<UniPCMultistepScheduler>(c);
  }
  if (cls == "FlowMatchEulerDiscreteScheduler") {
    auto c = FlowMatchEulerScheduler::parse_config(json);
    c.shift = *flow_shift;
    return std::make_unique<FlowMatchEulerScheduler>(c);
  }
  OMNI_THROW(path, ": _class_name '", cls, "' has no flow_shift to override");
}

std::shared_ptr<WanPipeline> load_wan_pipeline(const std::string& dir, at::ScalarType dtype) {
  const auto config = read_model_index(dir);
  const auto sub = [&](const char* name) { return (fs::path(dir) / name).string(); };
  // The scheduler first: a bad scheduler_config.json fails before the weights load. diffusers'
  // WanPipeline gives the scheduler no mu, so one that shifts by the image's size cannot run.
  const auto scheduler = load_flow_scheduler(sub("scheduler"));
  const auto* euler = dynamic_cast<const FlowMatchEulerScheduler*>(scheduler.get());
  OMNI_CHECK(euler == nullptr || !euler->config().dynamic_shifting, sub("scheduler"),
             "/scheduler_config.json: use_dynamic_shifting = true is not supported by the Wan "
             "pipeline (it passes no mu, the shift of the image's size)");
  const auto text_config = UMT5Config::parse(HfConfig::load(sub("text_encoder")));
  const auto vae_config = WanVAEConfig::load(sub("vae"));
  const auto t_config = WanTransformerConfig::load(sub("transformer"));
  check_fit(dir, text_config, t_config, "transformer", vae_config);
  // diffusers builds the per-token timesteps as mask[:, ::2, ::2]: one per (1, 2, 2) patch.
  OMNI_CHECK(!config.expand_timesteps ||
                 (t_config.patch_t == 1 && t_config.patch_h == 2 && t_config.patch_w == 2),
             dir, "/transformer/config.json: patch_size must be [1, 2, 2] with model_index.json ",
             "expand_timesteps true, got [", t_config.patch_t, ", ", t_config.patch_h, ", ",
             t_config.patch_w, "]");
  if (config.has_transformer_2) {
    const auto t2_config = WanTransformerConfig::load(sub("transformer_2"));
    check_fit(dir, text_config, t2_config, "transformer_2", vae_config);
    OMNI_CHECK(t_config.patch_t == t2_config.patch_t && t_config.patch_h == t2_config.patch_h &&
                   t_config.patch_w == t2_config.patch_w,
               dir,
               "/transformer_2/config.json: patch_size differs from transformer/config.json's");
  }
  auto tokenizer = Tokenizer::load(sub("tokenizer"));
  auto text_encoder = load_umt5_encoder(sub("text_encoder"), dtype);
  auto vae = load_wan_vae(sub("vae"), dtype);
  auto transformer = load_wan_transformer(sub("transformer"), dtype);
  std::shared_ptr<WanTransformer3DModel> transformer_2;
  if (config.has_transformer_2) transformer_2 = load_wan_transformer(sub("transformer_2"), dtype);
  return std::make_shared<WanPipeline>(dir, config, std::move(tokenizer), std::move(text_encoder),
                                       std::move(transformer), std::move(transformer_2),
                                       std::move(vae));
}

}  // namespace omni::models
