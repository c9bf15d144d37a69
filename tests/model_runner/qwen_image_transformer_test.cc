// QwenImageTransformer2DModel against diffusers 0.42.1 on a tiny config
// (tests/fixtures/qwen_image_transformer_tiny, written by make_qwen_image_transformer_fixture.py,
// every parameter redrawn so that no op hides behind a zero): a padded text mask, no mask, and
// Edit's condition image appended to the sequence; blocks and their phases are hookable units;
// bad config values name their field.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/qwen_image_transformer.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_transformer_tiny";
const std::vector<QwenImageShape> kImage = {{1, 4, 6}};
const std::vector<QwenImageShape> kEdit = {{1, 4, 6}, {1, 3, 4}};

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class QwenImageTransformerParity : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_qwen_image_transformer(kDir, at::kFloat);
    ref_ =
        std::make_unique<SafetensorsFile>(SafetensorsFile::open(kDir + "/reference.safetensors"));
  }
  at::Tensor run(QwenImageTransformer2DModel& model, const std::string& hidden,
                 const at::Tensor& mask, const std::vector<QwenImageShape>& images) {
    c10::InferenceMode guard;
    return model.forward(ref_->tensor(hidden), ref_->tensor("encoder_hidden_states"), mask,
                         ref_->tensor("timestep"), images);
  }
  std::shared_ptr<QwenImageTransformer2DModel> model_;
  std::unique_ptr<SafetensorsFile> ref_;
};

TEST_F(QwenImageTransformerParity, MatchesDiffusersWithAPaddedTextMask) {
  const auto out = run(*model_, "hidden_states", ref_->tensor("text_mask"), kImage);
  const auto expected = ref_->tensor("output");
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double diff = max_abs_diff(out, expected);
  std::cout << "qwen-image transformer max abs diff: " << diff << " (output mean |x| "
            << expected.abs().mean().item<double>() << ")\n";
  EXPECT_LE(diff, 1e-4);
}

TEST_F(QwenImageTransformerParity, MatchesDiffusersWithoutAMask) {
  const auto out = run(*model_, "hidden_states", at::Tensor(), kImage);
  EXPECT_LE(max_abs_diff(out, ref_->tensor("output_nomask")), 1e-4);
  // The mask matters: row 1's padding changes its output.
  EXPECT_GT(max_abs_diff(ref_->tensor("output_nomask")[1], ref_->tensor("output")[1]), 1e-2);
}

TEST_F(QwenImageTransformerParity, EditConditionImageMatchesDiffusers) {
  const auto out = run(*model_, "edit_hidden_states", ref_->tensor("text_mask"), kEdit);
  const double diff = max_abs_diff(out, ref_->tensor("edit_output"));
  std::cout << "qwen-image transformer (edit) max abs diff: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
}

// Row 1 of the batch equals its own run: nothing leaks between samples.
TEST_F(QwenImageTransformerParity, BatchRowsMatchSingleRuns) {
  c10::InferenceMode guard;
  const auto row = [&](const std::string& name) { return ref_->tensor(name).narrow(0, 1, 1); };
  const auto out = model_->forward(row("hidden_states"), row("encoder_hidden_states"),
                                   row("text_mask"), row("timestep"), kImage);
  EXPECT_LE(max_abs_diff(out[0], ref_->tensor("output")[1]), 1e-4);
}

class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++calls; }
  int calls = 0;
};

// Each block's and each phase's hooks, counting calls: blocks are entered through
// forward_passes (one call for all the guidance passes), phases through forward.
std::map<std::string, std::shared_ptr<CountingHook>> count_units(QwenImageTransformer2DModel& m) {
  std::map<std::string, std::shared_ptr<CountingHook>> hooks;
  for (int64_t i = 0; i < m.config().num_layers; ++i) {
    const std::string block =
        std::string(QwenImageTransformer2DModel::kBlocks) + "." + std::to_string(i);
    hooks[block] = std::make_shared<CountingHook>();
    offload::find_hookable(m, block).hooks().attach("forward_passes", "count", hooks[block]);
    for (const auto& phase : QwenImageTransformer2DModel::block_phases()) {
      std::string unit = block;
      unit += "." + phase;
      hooks[unit] = std::make_shared<CountingHook>();
      offload::find_hookable(m, unit).hooks().attach("forward", "count", hooks[unit]);
    }
  }
  return hooks;
}

TEST_F(QwenImageTransformerParity, BlocksAndPhasesAreHookableUnits) {
  const auto hooks = count_units(*model_);
  const auto out = run(*model_, "hidden_states", ref_->tensor("text_mask"), kImage);
  for (const auto& [unit, hook] : hooks) EXPECT_EQ(hook->calls, 1) << unit;
  EXPECT_LE(max_abs_diff(out, ref_->tensor("output")), 1e-4);
}

// The guidance passes (two texts of different lengths and masks) through forward_passes: each
// block is entered once for both, its attention and MLP phases back to back (the modulations
// once), and each output is bitwise the single-pass forward's.
TEST_F(QwenImageTransformerParity, GuidancePassesShareEachBlockVisit) {
  c10::InferenceMode guard;
  const auto x = ref_->tensor("hidden_states");
  const auto t = ref_->tensor("timestep");
  const auto text = ref_->tensor("encoder_hidden_states");
  const auto mask = ref_->tensor("text_mask");
  const QwenImageText cond{text, mask};
  const QwenImageText uncond{text.narrow(1, 0, text.size(1) - 2).flip(1) * 0.5, at::Tensor()};
  const auto alone_cond = model_->forward(x, cond.embeds, cond.mask, t, kImage);
  const auto alone_uncond = model_->forward(x, uncond.embeds, uncond.mask, t, kImage);
  const auto hooks = count_units(*model_);
  const auto both = model_->forward_passes(x, {cond, uncond}, t, kImage);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_TRUE(at::equal(both[0], alone_cond));
  EXPECT_TRUE(at::equal(both[1], alone_uncond));
  EXPECT_FALSE(at::equal(both[0], both[1]));
  for (const auto& [unit, hook] : hooks) {
    const bool per_pass =
        unit.find(".attn") != std::string::npos || unit.find("_mlp") != std::string::npos;
    EXPECT_EQ(hook->calls, per_pass ? 2 : 1) << unit;
  }
}

TEST_F(QwenImageTransformerParity, Bfloat16StaysClose) {
  auto model = load_qwen_image_transformer(kDir, at::kBFloat16);
  c10::InferenceMode guard;
  const auto out = model->forward(ref_->tensor("hidden_states").to(at::kBFloat16),
                                  ref_->tensor("encoder_hidden_states").to(at::kBFloat16),
                                  ref_->tensor("text_mask"), ref_->tensor("timestep"), kImage);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  // Against diffusers in bfloat16 (the timestep rounds to bfloat16 there too). This tiny model
  // amplifies rounding: diffusers' own bf16 output is 0.14 of max |x| from its fp32 one, so
  // the bound only catches a wrong op (off by the output's own scale).
  const auto expected = ref_->tensor("output_bf16");
  const double rel = max_abs_diff(out, expected) / expected.abs().max().item<double>();
  std::cout << "qwen-image transformer bf16 max abs diff / max |ref|: " << rel << "\n";
  EXPECT_LE(rel, 0.2);
}

TEST_F(QwenImageTransformerParity, MatchesDiffusersOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  model_->to(at::Device(at::kCUDA));
  c10::InferenceMode guard;
  const auto out = model_->forward(
      ref_->tensor("hidden_states").cuda(), ref_->tensor("encoder_hidden_states").cuda(),
      ref_->tensor("text_mask").cuda(), ref_->tensor("timestep").cuda(), kImage);
  ASSERT_TRUE(out.is_cuda());
  EXPECT_LE(max_abs_diff(out.cpu(), ref_->tensor("output")), 1e-3);
}

TEST_F(QwenImageTransformerParity, RejectsBadInputs) {
  EXPECT_CONTAINS(error_of([&] {
                    run(*model_, "hidden_states", ref_->tensor("text_mask"), {{1, 4, 5}});
                  }),
                  "tokens");
  EXPECT_CONTAINS(error_of([&] {
                    run(*model_, "hidden_states", ref_->tensor("text_mask").narrow(1, 0, 6),
                        kImage);
                  }),
                  "text mask");
}

class QwenImageTransformerConfigErrors : public testing::TempDirTest {
 protected:
  std::string error_with(const std::string& field, const nlohmann::json& value) {
    std::ifstream in(kDir + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config[field] = value;
    std::ofstream(path("config.json")) << config.dump(2);
    return error_of([&] { QwenImageTransformerConfig::load(dir()); });
  }
};

TEST_F(QwenImageTransformerConfigErrors, NamesTheField) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"zero_cond_t", true},
           {"guidance_embeds", true},
           {"use_layer3d_rope", true},
           {"axes_dims_rope", nlohmann::json::array({4, 6, 8})},
           {"num_layers", 0},
           {"_class_name", "FluxTransformer2DModel"}}) {
    const std::string error = error_with(field, value);
    EXPECT_CONTAINS(error, "'" + field + "'");
    EXPECT_CONTAINS(error, "config.json");
  }
}

}  // namespace
}  // namespace omni::models
