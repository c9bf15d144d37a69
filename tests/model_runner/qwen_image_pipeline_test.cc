// QwenImagePipeline against diffusers 0.42.1's QwenImagePipeline on a tiny folder
// (tests/fixtures/qwen_image_pipeline_tiny, make_qwen_image_pipeline_fixture.py, the released
// scheduler config with dynamic shifting): text-to-image without guidance (32 x 48) and with a
// negative prompt and true CFG (48 x 32, two images). The initial noise must be identical, the
// prompt embeddings, every transformer output and the images within 1e-4. Folders whose parts
// disagree and invalid requests must fail naming what is wrong.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_pipeline_tiny";
// make_qwen_image_pipeline_fixture.py's PROMPT and NEGATIVE.
const std::string kPrompt = "A red fox sitting by a café, golden hour light.";
const std::string kNegative = "blurry, low quality";

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

QwenImageRequest request_for(const std::string& c) {
  QwenImageRequest r;
  r.prompt = kPrompt;
  r.num_inference_steps = 3;
  r.true_cfg_scale = 4.0;
  if (c == "t2i") {
    r.height = 32;
    r.width = 48;
    r.seed = 7;
  } else {
    r.negative_prompt = kNegative;
    r.height = 48;
    r.width = 32;
    r.seed = 11;
    r.num_images = 2;
  }
  return r;
}

std::shared_ptr<QwenImagePipeline> pipeline() {
  static auto pipe = load_qwen_image_pipeline(kDir, at::kFloat);
  return pipe;
}

class QwenImagePipelineParity : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenImagePipelineParity, MatchesDiffusers) {
  const std::string c = GetParam();
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  auto r = request_for(c);
  std::vector<at::Tensor> outputs;
  at::Tensor initial;
  QwenImagePromptEmbeds prompt, negative;
  QwenImageTrace trace;
  trace.prompt = [&](bool neg, const QwenImagePromptEmbeds& e) { (neg ? negative : prompt) = e; };
  trace.initial_latents = [&](const at::Tensor& x) { initial = x.clone(); };
  trace.transformer = [&](int64_t, bool, const at::Tensor&, const at::Tensor& out) {
    outputs.push_back(out.clone());
  };
  r.trace = &trace;
  const auto result = pipeline()->generate(r);

  EXPECT_TRUE(at::equal(initial, ref.tensor(c + "_initial_latents")));
  EXPECT_LE(max_abs_diff(prompt.embeds, ref.tensor(c + "_prompt_embeds")), 1e-4);
  EXPECT_TRUE(at::equal(prompt.mask.to(at::kLong), ref.tensor(c + "_prompt_mask")));
  if (r.true_cfg()) {
    EXPECT_LE(max_abs_diff(negative.embeds, ref.tensor(c + "_negative_embeds")), 1e-4);
    EXPECT_TRUE(at::equal(negative.mask.to(at::kLong), ref.tensor(c + "_negative_mask")));
  }
  const auto expected_out = ref.tensor(c + "_transformer_out");
  ASSERT_EQ(static_cast<int64_t>(outputs.size()), expected_out.size(0));
  double worst = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    worst = std::max(worst, max_abs_diff(outputs[i], expected_out[static_cast<int64_t>(i)]));
  }
  const double image_diff = max_abs_diff(result.images, ref.tensor(c + "_images"));
  std::cout << c << ": transformer outputs max abs diff " << worst << ", images " << image_diff
            << "\n";
  EXPECT_LE(worst, 1e-4);
  EXPECT_LE(image_diff, 1e-4);
  EXPECT_EQ(result.images.sizes(), at::IntArrayRef({r.num_images, r.height, r.width, 3}));
}

INSTANTIATE_TEST_SUITE_P(Cases, QwenImagePipelineParity, ::testing::Values("t2i", "cfg"));

TEST(QwenImagePipeline, WithoutANegativePromptThereIsNoGuidance) {
  // true_cfg_scale > 1 alone does not guide (diffusers warns and runs one pass per step).
  auto r = request_for("t2i");
  int calls = 0;
  QwenImageTrace trace;
  trace.transformer = [&](int64_t, bool cond, const at::Tensor&, const at::Tensor&) {
    EXPECT_TRUE(cond);
    ++calls;
  };
  r.trace = &trace;
  pipeline()->generate(r);
  EXPECT_EQ(calls, 3);
  // A negative prompt with a scale of 1 does not guide either.
  r.negative_prompt = kNegative;
  r.true_cfg_scale = 1.0;
  calls = 0;
  pipeline()->generate(r);
  EXPECT_EQ(calls, 3);
}

TEST(QwenImagePipeline, Bfloat16Runs) {
  auto pipe = load_qwen_image_pipeline(kDir, at::kBFloat16);
  const auto result = pipe->generate(request_for("cfg"));
  EXPECT_EQ(result.images.sizes(), at::IntArrayRef({2, 48, 32, 3}));
  EXPECT_EQ(result.images.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(result.images).all().item<bool>());
}

TEST(QwenImagePipeline, ChildrenAreTheOffloadComponents) {
  auto pipe = pipeline();
  std::vector<std::string> names;
  for (const auto& child : pipe->named_children()) names.push_back(child.key());
  EXPECT_EQ(names, (std::vector<std::string>{"text_encoder", "transformer", "vae"}));
  const auto spec = pipe->offload_spec();
  ASSERT_EQ(spec.block_lists.size(), 1u);
  EXPECT_EQ(spec.block_lists[0].path, "transformer.transformer_blocks");
}

TEST(QwenImagePipeline, CallbackCancels) {
  int steps = 0;
  const auto result = pipeline()->generate(request_for("t2i"), [&](const QwenImageStep& s) {
    EXPECT_EQ(s.total, 3);
    return ++steps < 2;
  });
  EXPECT_TRUE(result.cancelled);
  EXPECT_FALSE(result.images.defined());
  EXPECT_EQ(steps, 2);
}

TEST(QwenImagePipeline, InvalidRequestsNameTheField) {
  auto bad = [](auto edit) {
    auto r = request_for("t2i");
    edit(r);
    return error_of([&] { pipeline()->generate(r); });
  };
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.height = 40; }), "height");
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.width = -16; }), "width");
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) {
                    r.images.push_back({2, 2, std::vector<uint8_t>(12)});
                  }),
                  "text-to-image");
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.num_inference_steps = 0; }),
                  "num_inference_steps");
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.num_images = 0; }), "num_images");
  // One step from sigma 1 is a division by zero in the released config's terminal stretch
  // (diffusers returns NaN images); an error instead.
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.num_inference_steps = 1; }), "2 or more");
  EXPECT_CONTAINS(bad([](QwenImageRequest& r) { r.max_sequence_length = 1025; }),
                  "max_sequence_length");
}

class QwenImagePipelineBrokenFolder : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fs::copy(kDir, dir(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  void edit_json(const std::string& file, const std::function<void(Json&)>& edit) {
    std::ifstream in(path(file));
    Json j = Json::parse(in);
    in.close();
    edit(j);
    std::ofstream(path(file)) << j.dump(2);
  }
  std::string load_error() {
    return error_of([&] { load_qwen_image_pipeline(dir(), at::kFloat); });
  }
};

TEST_F(QwenImagePipelineBrokenFolder, MissingVaeFolder) {
  fs::remove_all(path("vae"));
  EXPECT_CONTAINS(load_error(), "vae");
}

TEST_F(QwenImagePipelineBrokenFolder, WrongPipelineClass) {
  edit_json("model_index.json", [](Json& j) { j["_class_name"] = "WanPipeline"; });
  EXPECT_CONTAINS(load_error(), "QwenImagePipeline");
}

TEST_F(QwenImagePipelineBrokenFolder, EditPipelineWithoutProcessor) {
  edit_json("model_index.json", [](Json& j) { j["_class_name"] = "QwenImageEditPlusPipeline"; });
  const auto error = load_error();
  EXPECT_CONTAINS(error, "QwenImageEditPlusPipeline");
  EXPECT_CONTAINS(error, "processor");
}

TEST(QwenImagePipeline, DefaultSizeIs1024) {
  QwenImageRequest r;
  EXPECT_EQ(pipeline()->output_size(r), (std::pair<int64_t, int64_t>{1024, 1024}));
  r.width = 512;
  EXPECT_EQ(pipeline()->output_size(r), (std::pair<int64_t, int64_t>{1024, 512}));
}

TEST_F(QwenImagePipelineBrokenFolder, TextWidthDisagrees) {
  edit_json("transformer/config.json", [](Json& j) { j["joint_attention_dim"] = 48; });
  const auto error = load_error();
  EXPECT_CONTAINS(error, "joint_attention_dim");
  EXPECT_CONTAINS(error, "hidden_size");
}

TEST_F(QwenImagePipelineBrokenFolder, LatentChannelsDisagree) {
  edit_json("vae/config.json", [](Json& j) {
    j["z_dim"] = 8;
    j["latents_mean"] = std::vector<double>(8, 0.0);
    j["latents_std"] = std::vector<double>(8, 1.0);
  });
  EXPECT_CONTAINS(load_error(), "z_dim");
}

TEST_F(QwenImagePipelineBrokenFolder, AnotherSchedulerIsRefused) {
  edit_json("scheduler/scheduler_config.json",
            [](Json& j) { j["_class_name"] = "UniPCMultistepScheduler"; });
  EXPECT_CONTAINS(load_error(), "FlowMatchEulerDiscreteScheduler");
}

}  // namespace
}  // namespace omni::models
