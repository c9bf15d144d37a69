// QwenImageEditPipeline and QwenImageEditPlusPipeline against diffusers 0.42.1 with the fix of
// PR #14189 (the text encoder gets Qwen2.5-VL's 3-D image positions) on a tiny folder
// (tests/fixtures/qwen_image_edit_pipeline_tiny, make_qwen_image_edit_pipeline_fixture.py, the
// released scheduler config): an Edit with a negative prompt and true CFG (32 x 48), and an
// Edit-Plus of two images without guidance (48 x 32, two outputs). The Pillow LANCZOS resizes
// must be bit-exact, the processor's token ids equal, the prompt embeddings, every transformer
// output and the images within 1e-4.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_edit_pipeline_tiny";
// make_qwen_image_edit_pipeline_fixture.py's PROMPT and NEGATIVE.
const std::string kPrompt = "Make the fox blue, keep the café.";
const std::string kNegative = "blurry, low quality";

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

const SafetensorsFile& reference() {
  static const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  return ref;
}

std::shared_ptr<QwenImagePipeline> pipeline(const std::string& c) {
  static auto edit = load_qwen_image_pipeline(kDir, at::kFloat);
  static auto plus = load_qwen_image_pipeline(kDir + "/plus", at::kFloat);
  return c == "edit" ? edit : plus;
}

QwenImageRequest request_for(const std::string& c) {
  QwenImageRequest r;
  r.prompt = kPrompt;
  r.num_inference_steps = 2;
  r.true_cfg_scale = 4.0;
  r.images.push_back(read_image_file(kDir + "/image_a.png"));
  if (c == "edit") {
    r.negative_prompt = kNegative;
    r.height = 32;
    r.width = 48;
    r.seed = 5;
  } else {
    r.images.push_back(read_image_file(kDir + "/image_b.png"));
    r.height = 48;
    r.width = 32;
    r.seed = 9;
    r.num_images = 2;
  }
  return r;
}

// The fixture keeps a resized image's row and column sums and its corner.
void expect_image(const RgbImage& image, const std::string& key) {
  const auto& ref = reference();
  const auto pixels = at::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                    {image.height, image.width, 3}, at::kByte)
                          .clone();
  EXPECT_TRUE(at::equal(pixels.to(at::kLong).sum(1), ref.tensor(key + "_rows"))) << key;
  EXPECT_TRUE(at::equal(pixels.to(at::kLong).sum(0), ref.tensor(key + "_cols"))) << key;
  EXPECT_TRUE(at::equal(pixels.narrow(0, 0, 16).narrow(1, 0, 16), ref.tensor(key + "_corner")))
      << key;
}

class QwenImageEditParity : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenImageEditParity, ImagesResizeAsPillowDoes) {
  const std::string c = GetParam();
  const auto r = request_for(c);
  const auto variant = c == "edit" ? QwenImageVariant::kEdit : QwenImageVariant::kEditPlus;
  const auto images = prepare_qwen_image_edit_images(variant, r.images);
  ASSERT_EQ(images.condition.size(), r.images.size());
  for (size_t i = 0; i < r.images.size(); ++i) {
    expect_image(images.condition[i], c + "_condition_rgb_" + std::to_string(i));
    expect_image(images.vae[i], c + "_vae_rgb_" + std::to_string(i));
  }
  // The default output size: the sizing image at an area of 1024^2.
  const auto calculated = reference().tensor(c + "_calculated");
  auto defaults = r;
  defaults.height = defaults.width = 0;
  EXPECT_EQ(
      pipeline(c)->output_size(defaults),
      (std::pair<int64_t, int64_t>{calculated[1].item<int64_t>(), calculated[0].item<int64_t>()}));
}

TEST_P(QwenImageEditParity, MatchesDiffusers) {
  const std::string c = GetParam();
  const auto& ref = reference();
  auto r = request_for(c);
  std::vector<at::Tensor> outputs;
  QwenImagePromptEmbeds prompt, negative;
  QwenImageTrace trace;
  trace.prompt = [&](bool neg, const QwenImagePromptEmbeds& e) { (neg ? negative : prompt) = e; };
  trace.transformer = [&](int64_t, bool, const at::Tensor&, const at::Tensor& out) {
    outputs.push_back(out.clone());
  };
  r.trace = &trace;
  const auto result = pipeline(c)->generate(r);

  const double prompt_diff = max_abs_diff(prompt.embeds, ref.tensor(c + "_prompt_embeds"));
  EXPECT_LE(prompt_diff, 1e-4);
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
  std::cout << c << ": prompt embeddings max abs diff " << prompt_diff << ", transformer outputs "
            << worst << ", images " << image_diff << "\n";
  EXPECT_LE(worst, 1e-4);
  EXPECT_LE(image_diff, 1e-4);
}

TEST_P(QwenImageEditParity, TokenIdsMatchTheProcessor) {
  const std::string c = GetParam();
  auto pipe = pipeline(c);
  const auto r = request_for(c);
  const auto images = prepare_qwen_image_edit_images(pipe->variant(), r.images);
  at::Tensor ids;
  const auto vision = encode_qwen_image_edit_images(pipe->vision(), images.condition, c10::kCPU);
  encode_qwen_image_edit_prompt(pipe->tokenizer(), pipe->text_encoder(), pipe->vision(),
                                pipe->variant(), kPrompt, vision, c10::kCPU, &ids);
  EXPECT_TRUE(at::equal(ids, reference().tensor(c + "_input_ids")));
}

INSTANTIATE_TEST_SUITE_P(Cases, QwenImageEditParity, ::testing::Values("edit", "plus"));

TEST(QwenImageEditPipeline, VisionTowerIsAnEncoderChild) {
  std::vector<std::string> names;
  for (const auto& child : pipeline("edit")->named_children()) names.push_back(child.key());
  EXPECT_EQ(names, (std::vector<std::string>{"text_encoder", "visual", "transformer", "vae"}));
  const auto spec = pipeline("edit")->offload_spec();
  EXPECT_EQ(spec.encoders, (std::vector<std::string>{"text_encoder", "visual"}));
}

TEST(QwenImageEditPipeline, InvalidRequestsNameTheProblem) {
  auto edit = request_for("edit");
  edit.images.push_back(edit.images.front());
  EXPECT_CONTAINS(error_of([&] { pipeline("edit")->generate(edit); }), "edits one image");
  auto none = request_for("plus");
  none.images.clear();
  EXPECT_CONTAINS(error_of([&] { pipeline("plus")->generate(none); }), "needs an image");
  auto tagged = request_for("edit");
  tagged.prompt = "make it <|image_pad|> blue";
  EXPECT_CONTAINS(error_of([&] { pipeline("edit")->generate(tagged); }), "<|image_pad|>");
  auto empty = request_for("edit");
  empty.images[0] = RgbImage{};
  EXPECT_CONTAINS(error_of([&] { pipeline("edit")->generate(empty); }), "images[0]");
}

TEST(QwenImageEditPipeline, CalculateDimensionsAsDiffusers) {
  // calculate_dimensions(1024 * 1024, w / h) for the fixture's images and a few others
  // (diffusers 0.42.1).
  EXPECT_EQ(qwen_image_calculate_dimensions(1024.0 * 1024.0, 40.0 / 56.0),
            (std::pair<int64_t, int64_t>{864, 1216}));
  EXPECT_EQ(qwen_image_calculate_dimensions(1024.0 * 1024.0, 64.0 / 36.0),
            (std::pair<int64_t, int64_t>{1376, 768}));
  EXPECT_EQ(qwen_image_calculate_dimensions(384.0 * 384.0, 40.0 / 56.0),
            (std::pair<int64_t, int64_t>{320, 448}));
  EXPECT_EQ(qwen_image_calculate_dimensions(1024.0 * 1024.0, 1.0),
            (std::pair<int64_t, int64_t>{1024, 1024}));
}

}  // namespace
}  // namespace omni::models
