// WanTransformer3DModel against diffusers 0.42.1 on the tiny config of diffusers' Wan tests
// (tests/fixtures/wan_transformer_tiny, written by make_wan_transformer_fixture.py, every
// parameter redrawn so that no op hides behind a zero): one timestep per sample and TI2V's
// per-token timesteps; the blocks are hookable units; bad config values name their field.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/wan_transformer.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/wan_transformer_tiny";

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class WanTransformerParity : public ::testing::Test {
 protected:
  void SetUp() override { model_ = load_wan_transformer(kDir, at::kFloat); }
  std::shared_ptr<WanTransformer3DModel> model_;
};

TEST_F(WanTransformerParity, MatchesDiffusers) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto out = model_->forward(ref.tensor("hidden_states"), ref.tensor("timestep"),
                                   ref.tensor("encoder_hidden_states"));
  const auto expected = ref.tensor("output");
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double diff = max_abs_diff(out, expected);
  std::cout << "wan transformer max abs diff: " << diff << " (output mean |x| "
            << expected.abs().mean().item<double>() << ")\n";
  EXPECT_LE(diff, 1e-4);
}

TEST_F(WanTransformerParity, PerTokenTimestepsMatchDiffusers) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto out = model_->forward(ref.tensor("hidden_states"), ref.tensor("timestep_seq"),
                                   ref.tensor("encoder_hidden_states"));
  const double diff = max_abs_diff(out, ref.tensor("output_seq"));
  std::cout << "wan transformer (per-token timesteps) max abs diff: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  // The per-token path differs from the scalar one (frame 0 at t = 0).
  EXPECT_GT(max_abs_diff(ref.tensor("output_seq"), ref.tensor("output")), 1e-2);
}

// A batch of two samples with different timesteps and prompts: each row equals its own run.
TEST_F(WanTransformerParity, BatchRowsMatchSingleRuns) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto x = ref.tensor("hidden_states");
  const auto ctx = ref.tensor("encoder_hidden_states");
  const auto x2 = at::cat({x, x.flip(2)});
  const auto ctx2 = at::cat({ctx, ctx.flip(1)});
  const auto out = model_->forward(x2, at::tensor({500.0f, 80.0f}), ctx2);
  EXPECT_LE(max_abs_diff(out[0], ref.tensor("output")[0]), 1e-4);
  const auto single = model_->forward(x.flip(2), at::tensor({80.0f}), ctx.flip(1));
  EXPECT_LE(max_abs_diff(out[1], single[0]), 1e-4);
}

class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++calls; }
  int calls = 0;
};

TEST_F(WanTransformerParity, BlocksAreHookableUnits) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  std::vector<std::shared_ptr<CountingHook>> hooks;
  for (int64_t i = 0; i < model_->config().num_layers; ++i) {
    auto hook = std::make_shared<CountingHook>();
    // The model enters its blocks through forward_passes (one call for the guidance passes).
    offload::find_hookable(*model_, "blocks." + std::to_string(i))
        .hooks()
        .attach("forward_passes", "count", hook);
    hooks.push_back(hook);
  }
  c10::InferenceMode guard;
  const auto out = model_->forward(ref.tensor("hidden_states"), ref.tensor("timestep"),
                                   ref.tensor("encoder_hidden_states"));
  for (const auto& hook : hooks) EXPECT_EQ(hook->calls, 1);
  EXPECT_LE(max_abs_diff(out, ref.tensor("output")), 1e-4);
}

// A request's guidance passes and another request's pass through forward_passes: each block
// entered once for all three, each phase (attn1, attn2, ffn) three times back to back, each
// output bitwise the single-pass forward's.
TEST_F(WanTransformerParity, PassesShareEachBlockVisit) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  c10::InferenceMode guard;
  const auto x = ref.tensor("hidden_states");
  const auto t = ref.tensor("timestep");
  const auto cond = ref.tensor("encoder_hidden_states");
  const auto uncond = cond.flip(1) * 0.5;
  const auto other_x = x.flip(2);
  const auto other_t = at::tensor({80.0f});
  const auto alone_cond = model_->forward(x, t, cond);
  const auto alone_uncond = model_->forward(x, t, uncond);
  const auto alone_other = model_->forward(other_x, other_t, uncond);
  std::vector<std::pair<std::string, std::shared_ptr<CountingHook>>> hooks;
  for (int64_t i = 0; i < model_->config().num_layers; ++i) {
    const std::string block = "blocks." + std::to_string(i);
    hooks.emplace_back(block, std::make_shared<CountingHook>());
    offload::find_hookable(*model_, block)
        .hooks()
        .attach("forward_passes", "count", hooks.back().second);
    for (const char* phase : {"attn1", "attn2", "ffn"}) {
      hooks.emplace_back(block + "." + phase, std::make_shared<CountingHook>());
      offload::find_hookable(*model_, hooks.back().first)
          .hooks()
          .attach("forward", "count", hooks.back().second);
    }
  }
  const auto all =
      model_->forward_passes({{x, t, cond}, {x, t, uncond}, {other_x, other_t, uncond}});
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(at::equal(all[0], alone_cond));
  EXPECT_TRUE(at::equal(all[1], alone_uncond));
  EXPECT_TRUE(at::equal(all[2], alone_other));
  EXPECT_FALSE(at::equal(all[0], all[1]));
  for (const auto& [unit, hook] : hooks) {
    EXPECT_EQ(hook->calls, unit.find('.', 7) == std::string::npos ? 1 : 3) << unit;
  }
}

TEST_F(WanTransformerParity, Bfloat16StaysClose) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  auto model = load_wan_transformer(kDir, at::kBFloat16);
  c10::InferenceMode guard;
  const auto out =
      model->forward(ref.tensor("hidden_states").to(at::kBFloat16), ref.tensor("timestep"),
                     ref.tensor("encoder_hidden_states").to(at::kBFloat16));
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const auto expected = ref.tensor("output");
  // bf16 keeps ~3 significant digits; a wrong op would be off by the output's own scale.
  const double rel = max_abs_diff(out, expected) / expected.abs().max().item<double>();
  std::cout << "wan transformer bf16 max abs diff / max |ref|: " << rel << "\n";
  EXPECT_LE(rel, 0.03);
}

TEST_F(WanTransformerParity, MatchesDiffusersOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  model_->to(at::Device(at::kCUDA));
  c10::InferenceMode guard;
  const auto out =
      model_->forward(ref.tensor("hidden_states").cuda(), ref.tensor("timestep").cuda(),
                      ref.tensor("encoder_hidden_states").cuda());
  ASSERT_TRUE(out.is_cuda());
  const double diff = max_abs_diff(out.cpu(), ref.tensor("output"));
  std::cout << "wan transformer (CUDA) max abs diff: " << diff << "\n";
  // TF32 is off by default in LibTorch; allow for the GPU kernels' summation order.
  EXPECT_LE(diff, 1e-3);
}

TEST_F(WanTransformerParity, RejectsBadInputs) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  c10::InferenceMode guard;
  EXPECT_CONTAINS(error_of([&] {
                    model_->forward(ref.tensor("hidden_states").narrow(3, 0, 7),
                                    ref.tensor("timestep"), ref.tensor("encoder_hidden_states"));
                  }),
                  "patch_size");
  EXPECT_CONTAINS(error_of([&] {
                    model_->forward(ref.tensor("hidden_states"), at::zeros({1, 5}),
                                    ref.tensor("encoder_hidden_states"));
                  }),
                  "per-token timesteps");
}

class WanTransformerConfigErrors : public testing::TempDirTest {
 protected:
  // Writes the fixture's config.json with `field` set to `value` into the temp folder.
  void write_config(const std::string& field, const nlohmann::json& value) {
    std::ifstream in(kDir + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config[field] = value;
    std::ofstream(path("config.json")) << config.dump(2);
  }
  std::string error_with(const std::string& field, const nlohmann::json& value) {
    write_config(field, value);
    return error_of([&] { WanTransformerConfig::load(dir()); });
  }
};

TEST_F(WanTransformerConfigErrors, NamesTheField) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"qk_norm", "rms_norm"},
           {"image_dim", 1280},
           {"added_kv_proj_dim", 24},
           {"pos_embed_seq_len", 514},
           {"patch_size", nlohmann::json::array({1, 2})},
           {"num_layers", 0},
           {"_class_name", "WanVACETransformer3DModel"}}) {
    const std::string error = error_with(field, value);
    EXPECT_CONTAINS(error, "'" + field + "'");
    EXPECT_CONTAINS(error, "config.json");
  }
  // A wrong JSON type is the HfConfig reader's error, which names the field too.
  EXPECT_CONTAINS(error_with("attention_head_dim", "twelve"), "attention_head_dim");
  // A good config still loads.
  write_config("num_layers", 3);
  EXPECT_EQ(WanTransformerConfig::load(dir()).num_layers, 3);
}

}  // namespace
}  // namespace omni::models
