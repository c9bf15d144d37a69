// AutoencoderKLWan against diffusers 0.42.1 (tests/fixtures, written by make_wan_vae_fixture.py
// with every parameter redrawn so that no op hides behind a zero) on the tiny configs of
// diffusers' Wan tests: wan_vae_tiny (Wan2.1, z_dim 16) and wan22_vae_tiny (Wan2.2-TI2V, z_dim
// 48, residual blocks, patch_size 2); and on wan22_vae_wide_tiny (the Wan2.2 design with unequal
// channel widths). Decode of a 3-frame latent (float32 and bfloat16), encode of a short video;
// encoder / decoder are hookable units; bad config values name their field. And diffusers'
// AutoencoderKLQwenImage (qwen_image_vae_tiny, make_qwen_image_vae_fixture.py) on one frame, as
// Qwen-Image uses it, through the same class.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/wan_vae.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kWan21 = std::string(OMNI_FIXTURES_DIR) + "/wan_vae_tiny";
const std::string kWan22 = std::string(OMNI_FIXTURES_DIR) + "/wan22_vae_tiny";
// Not a diffusers test config: Wan2.2's unequal widths (dim_mult [1, 2, 4, 4], decoder_base_dim),
// where AvgDown3D / DupUp3D mix channels.
const std::string kWan22Wide = std::string(OMNI_FIXTURES_DIR) + "/wan22_vae_wide_tiny";
const std::string kQwenImage = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_vae_tiny";

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class WanVaeParity : public ::testing::TestWithParam<std::string> {};

TEST_P(WanVaeParity, DecodeMatchesDiffusers) {
  const auto vae = load_wan_vae(GetParam(), at::kFloat);
  const auto ref = SafetensorsFile::open(GetParam() + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto out = vae->decode(ref.tensor("latents"));
  const auto expected = ref.tensor("decoded");
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double diff = max_abs_diff(out, expected);
  std::cout << std::filesystem::path(GetParam()).filename().string()
            << " decode max abs diff: " << diff << " (mean |x| "
            << expected.abs().mean().item<double>() << ", " << expected.sizes() << ")\n";
  EXPECT_LE(diff, 1e-4);
  // Not saturated: the clamp leaves most of the video alone.
  EXPECT_GT((expected.abs() < 0.999).to(at::kFloat).mean().item<double>(), 0.3);
}

// decode_chunks hands over one latent frame's frames at a time (1, then 4 each): together
// decode's video bit for bit.
TEST_P(WanVaeParity, ChunksAreTheDecodeFrameByFrame) {
  const auto vae = load_wan_vae(GetParam(), at::kFloat);
  const auto ref = SafetensorsFile::open(GetParam() + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto latents = ref.tensor("latents");
  std::vector<at::Tensor> chunks;
  vae->decode_chunks(latents, [&](const at::Tensor& chunk) { chunks.push_back(chunk.clone()); });
  ASSERT_EQ(static_cast<int64_t>(chunks.size()), latents.size(2));
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].size(2), i == 0 ? 1 : 4) << i;
  }
  EXPECT_TRUE(at::equal(at::cat(chunks, 2), vae->decode(latents)));
}

TEST_P(WanVaeParity, EncodeMatchesDiffusers) {
  const auto vae = load_wan_vae(GetParam(), at::kFloat);
  const auto ref = SafetensorsFile::open(GetParam() + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto dist = vae->encode(ref.tensor("video"));
  const auto expected = ref.tensor("mean");
  ASSERT_EQ(dist.mode().sizes(), expected.sizes());
  const double diff = max_abs_diff(dist.mode(), expected);
  const double diff_logvar = max_abs_diff(dist.logvar, ref.tensor("logvar"));
  std::cout << std::filesystem::path(GetParam()).filename().string()
            << " encode max abs diff: mean " << diff << ", logvar " << diff_logvar
            << " (mean |mean| " << expected.abs().mean().item<double>() << ", " << expected.sizes()
            << ")\n";
  EXPECT_LE(diff, 1e-4);
  EXPECT_LE(diff_logvar, 1e-4);
}

// In bfloat16 the random tiny nets drift far from float32 (diffusers' own bf16 decode of
// wan_vae_tiny is up to 1.9 off its float32 one), so compare with diffusers' bf16 decode.
TEST_P(WanVaeParity, Bfloat16MatchesDiffusersBfloat16) {
  const auto vae = load_wan_vae(GetParam(), at::kBFloat16);
  const auto ref = SafetensorsFile::open(GetParam() + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto out = vae->decode(ref.tensor("latents").to(at::kBFloat16));
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const double diff = max_abs_diff(out, ref.tensor("decoded_bf16"));
  std::cout << std::filesystem::path(GetParam()).filename().string()
            << " bf16 decode max abs diff vs diffusers bf16: " << diff
            << " (vs float32: " << max_abs_diff(out, ref.tensor("decoded")) << ")\n";
  EXPECT_LE(diff, 2e-2);
}

TEST_P(WanVaeParity, MatchesDiffusersOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto vae = load_wan_vae(GetParam(), at::kFloat);
  vae->to(at::Device(at::kCUDA));
  const auto ref = SafetensorsFile::open(GetParam() + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto out = vae->decode(ref.tensor("latents").cuda());
  ASSERT_TRUE(out.is_cuda());
  const auto mean = vae->encode(ref.tensor("video").cuda()).mean;
  const double d1 = max_abs_diff(out.cpu(), ref.tensor("decoded"));
  const double d2 = max_abs_diff(mean.cpu(), ref.tensor("mean"));
  std::cout << "CUDA decode / encode max abs diff: " << d1 << " / " << d2 << "\n";
  EXPECT_LE(d1, 1e-3);
  EXPECT_LE(d2, 1e-3);
}

std::string variant_name(const ::testing::TestParamInfo<std::string>& param_info) {
  if (param_info.param == kWan21) return "Wan21";
  return param_info.param == kWan22 ? "Wan22" : "Wan22Wide";
}

INSTANTIATE_TEST_SUITE_P(Variants, WanVaeParity, ::testing::Values(kWan21, kWan22, kWan22Wide),
                         variant_name);

class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++calls; }
  int calls = 0;
};

// The decoder runs once per latent frame, the encoder once per chunk (1 + 4 + 4 frames), both
// through their hooks.
TEST(WanVae, EncoderAndDecoderAreHookableUnits) {
  const auto vae = load_wan_vae(kWan21, at::kFloat);
  const auto ref = SafetensorsFile::open(kWan21 + "/reference.safetensors");
  auto dec = std::make_shared<CountingHook>();
  auto enc = std::make_shared<CountingHook>();
  offload::find_hookable(*vae, "decoder").hooks().attach("forward", "count", dec);
  offload::find_hookable(*vae, "encoder").hooks().attach("forward", "count", enc);
  c10::InferenceMode guard;
  const auto out = vae->decode(ref.tensor("latents"));
  vae->encode(ref.tensor("video"));
  EXPECT_EQ(dec->calls, 3);
  EXPECT_EQ(enc->calls, 3);
  EXPECT_LE(max_abs_diff(out, ref.tensor("decoded")), 1e-4);
}

// The pipelines' latent scaling round-trips and uses the config's tables.
TEST(WanVae, LatentScaling) {
  const auto vae = load_wan_vae(kWan21, at::kFloat);
  const auto& c = vae->config();
  ASSERT_EQ(c.latents_mean.size(), 16u);
  const auto x = at::randn({1, 16, 2, 3, 3});
  const auto n = vae->normalize_latents(x);
  EXPECT_NEAR(n[0][3][0][0][0].item<double>(),
              (x[0][3][0][0][0].item<double>() - c.latents_mean[3]) / c.latents_std[3], 1e-5);
  EXPECT_LE(max_abs_diff(vae->denormalize_latents(n), x), 1e-5);
}

TEST(WanVae, RejectsBadInputs) {
  const auto vae = load_wan_vae(kWan22, at::kFloat);
  c10::InferenceMode guard;
  EXPECT_CONTAINS(error_of([&] { vae->decode(at::zeros({1, 16, 1, 2, 2})); }), "latents");
  EXPECT_CONTAINS(error_of([&] { vae->encode(at::zeros({1, 3, 1, 31, 32})); }), "patch_size");
}

class WanVaeConfigErrors : public testing::TempDirTest {
 protected:
  void write_config(const std::string& field, const nlohmann::json& value) {
    std::ifstream in(kWan22 + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config[field] = value;
    std::ofstream(path("config.json")) << config.dump(2);
  }
  std::string error_with(const std::string& field, const nlohmann::json& value) {
    write_config(field, value);
    return error_of([&] { WanVAEConfig::load(dir()); });
  }
};

TEST_F(WanVaeConfigErrors, NamesTheField) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"attn_scales", nlohmann::json::array({0.5})},
           {"temperal_downsample", nlohmann::json::array({true})},
           {"temperal_downsample", nlohmann::json::array({1, 0, 0})},
           {"latents_mean", nlohmann::json::array({0.0, 1.0})},
           {"dim_mult", nlohmann::json::array()},
           {"z_dim", 0},
           {"patch_size", -2},
           {"_class_name", "AutoencoderKL"}}) {
    const std::string error = error_with(field, value);
    EXPECT_CONTAINS(error, "'" + field + "'");
    EXPECT_CONTAINS(error, "config.json");
  }
  // A wrong JSON type is the HfConfig reader's error, which names the field too.
  EXPECT_CONTAINS(error_with("base_dim", "three"), "base_dim");
  // A good config still loads; null patch_size means no patchify.
  write_config("patch_size", nullptr);
  EXPECT_EQ(WanVAEConfig::load(dir()).patch_size, 1);
  EXPECT_EQ(WanVAEConfig::load(kWan22).patch_size, 2);
  EXPECT_TRUE(WanVAEConfig::load(kWan22).is_residual);
}

// AutoencoderKLQwenImage: an image [1, 3, 1, H, W] to its latent mean, a one-frame latent
// [1, 16, 1, h, w] to an image.
TEST(WanVae, QwenImageEncodeAndDecodeMatchDiffusers) {
  const auto vae = load_wan_vae(kQwenImage, at::kFloat);
  const auto& c = vae->config();
  EXPECT_EQ(c.in_channels, 3);
  EXPECT_EQ(c.out_channels, 3);
  EXPECT_FALSE(c.is_residual);
  EXPECT_EQ(c.patch_size, 1);
  EXPECT_EQ(c.decoder_base_dim, c.base_dim);
  EXPECT_EQ(c.scale_factor_spatial, 8);
  EXPECT_EQ(c.scale_factor_temporal, 4);
  const auto ref = SafetensorsFile::open(kQwenImage + "/reference.safetensors");
  c10::InferenceMode guard;

  const auto dist = vae->encode(ref.tensor("image"));
  const auto mean = ref.tensor("mean");
  ASSERT_EQ(dist.mode().sizes(), mean.sizes());
  const double diff_mean = max_abs_diff(dist.mode(), mean);
  const double diff_logvar = max_abs_diff(dist.logvar, ref.tensor("logvar"));
  std::cout << "qwen_image_vae_tiny encode max abs diff: mean " << diff_mean << ", logvar "
            << diff_logvar << " (mean |mean| " << mean.abs().mean().item<double>() << ", "
            << mean.sizes() << ")\n";
  EXPECT_LE(diff_mean, 1e-4);
  EXPECT_LE(diff_logvar, 1e-4);

  const auto out = vae->decode(ref.tensor("latents"));
  const auto expected = ref.tensor("decoded");
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double diff = max_abs_diff(out, expected);
  std::cout << "qwen_image_vae_tiny decode max abs diff: " << diff << " (mean |x| "
            << expected.abs().mean().item<double>() << ", " << expected.sizes() << ")\n";
  EXPECT_LE(diff, 1e-4);
  EXPECT_GT((expected.abs() < 0.999).to(at::kFloat).mean().item<double>(), 0.3);
}

class WanVaeQwenImageConfig : public testing::TempDirTest {
 protected:
  // The fixture's config with `edit` applied, written to the temporary folder.
  template <typename Edit>
  std::string write(Edit edit) {
    std::ifstream in(kQwenImage + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    edit(config);
    std::ofstream(path("config.json")) << config.dump(2);
    return dir();
  }
};

TEST_F(WanVaeQwenImageConfig, BadFieldsNameTheFieldAndClass) {
  for (const auto& entry : std::vector<std::pair<std::string, nlohmann::json>>{
           {"input_channels", 0},
           {"z_dim", -1},
           {"attn_scales", nlohmann::json::array({0.25})},
           {"temperal_downsample", nlohmann::json::array({false})},
           {"latents_std", nlohmann::json::array({1.0, 2.0})}}) {
    const std::string& field = entry.first;
    const std::string dir = write([&](nlohmann::json& j) { j[field] = entry.second; });
    const std::string error = error_of([&] { WanVAEConfig::load(dir); });
    EXPECT_CONTAINS(error, "'" + field + "'");
    EXPECT_CONTAINS(error, "config.json");
    EXPECT_CONTAINS(error, "AutoencoderKLQwenImage");
  }
  const std::string dir = write([](nlohmann::json& j) { j["input_channels"] = "three"; });
  EXPECT_CONTAINS(error_of([&] { WanVAEConfig::load(dir); }), "input_channels");
}

// input_channels sets both ends; AutoencoderKLWan's fields are not read (diffusers ignores them
// for this class too); absent tables are diffusers' defaults.
TEST_F(WanVaeQwenImageConfig, FieldMapping) {
  const auto c = WanVAEConfig::load(write([](nlohmann::json& j) {
    j["input_channels"] = 4;
    j["in_channels"] = 12;
    j["out_channels"] = 12;
    j["is_residual"] = true;
    j["patch_size"] = 2;
    j["decoder_base_dim"] = 7;
    j.erase("latents_mean");
    j.erase("latents_std");
  }));
  EXPECT_EQ(c.in_channels, 4);
  EXPECT_EQ(c.out_channels, 4);
  EXPECT_FALSE(c.is_residual);
  EXPECT_EQ(c.patch_size, 1);
  EXPECT_EQ(c.decoder_base_dim, 3);
  ASSERT_EQ(c.latents_mean.size(), 16u);
  EXPECT_DOUBLE_EQ(c.latents_mean[0], -0.7571);
  EXPECT_DOUBLE_EQ(c.latents_std[15], 1.9160);
  const auto fixture = WanVAEConfig::load(kQwenImage);
  EXPECT_EQ(fixture.latents_mean, c.latents_mean);
  EXPECT_EQ(fixture.latents_std, c.latents_std);
}

}  // namespace
}  // namespace omni::models
