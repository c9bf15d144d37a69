// `vllm-omni generate` on the tiny diffusers Qwen-Image folder (tests/fixtures/
// qwen_image_pipeline_tiny), run as a user runs it: the .npy it writes is within 1e-4 of
// diffusers' images (reference.safetensors, output_type="np"), the .png is diffusers'
// output_type="pil" image (round(x * 255) of the same floats, so within one level where the
// floats sit on a rounding edge), several images go to numbered files, --json reports one step
// time per step; model-level and layerwise offload and the stage config qwen_image_tiny.yaml (a
// gRPC worker) give the same images bit for bit; flags the model does not read fail naming the
// flag.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/npy_reader.h"
#include "generate_e2e.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/weights/safetensors.h"
#include "process.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using omni::testing::read_npy;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_pipeline_tiny";

// make_qwen_image_pipeline_fixture.py's cases as flags.
std::vector<std::string> case_args(const std::string& c) {
  std::vector<std::string> args = {"--prompt", "A red fox sitting by a café, golden hour light.",
                                   "--num-inference-steps", "3"};
  if (c == "t2i") {
    args.insert(args.end(), {"--height", "32", "--width", "48", "--seed", "7"});
  } else {
    args.insert(args.end(),
                {"--negative-prompt", "blurry, low quality", "--true-cfg-scale", "4", "--height",
                 "48", "--width", "32", "--seed", "11", "--num-images", "2"});
  }
  return args;
}

at::Tensor reference(const std::string& name) {
  return models::SafetensorsFile::open(kDir + "/reference.safetensors").tensor(name);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// A PNG as [H, W, 3] uint8.
at::Tensor read_png(const std::string& path) {
  const auto image = models::read_image_file(path);
  return at::tensor(std::vector<uint8_t>(image.pixels.begin(), image.pixels.end()), at::kByte)
      .view({image.height, image.width, 3});
}

class GenerateImage : public GenerateE2eTest {
 protected:
  Json generate(const std::vector<std::string>& source, const std::string& c,
                const std::vector<std::string>& extra) {
    std::vector<std::string> args = source;
    for (const auto& a : case_args(c)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    return generate_json(args);
  }
  std::string error_of(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {OMNI_VLLM_OMNI, "generate", "--model", kDir};
    for (const auto& a : case_args("t2i")) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    const process::ProcessResult r = process::run_process(args);
    EXPECT_NE(r.status, 0);
    return r.err;
  }
};

TEST_F(GenerateImage, NpyEqualsDiffusersImages) {
  for (const char* c : {"t2i", "cfg"}) {
    const std::string npy = path(std::string(c) + ".npy");
    const Json j = generate({"--model", kDir}, c, {"--output", npy});
    ASSERT_FALSE(j.is_null()) << c;
    const at::Tensor expected = reference(std::string(c) + "_images");
    EXPECT_LE(max_abs_diff(read_npy(npy), expected), 1e-4) << c;
    EXPECT_EQ(j["images"], expected.size(0));
    EXPECT_EQ(j["height"], expected.size(1));
    EXPECT_EQ(j["width"], expected.size(2));
    EXPECT_EQ(j["files"], Json::array({npy}));
    EXPECT_EQ(j["finish_reason"], "stop");
    EXPECT_EQ(j["timings"]["step_ms"].size(), 3u) << "one progress packet per step";
    EXPECT_EQ(j["offload"]["stage 0 (qwen_image)"]["strategy"], "none");
  }
}

TEST_F(GenerateImage, PngIsDiffusersPilImage) {
  const Json j = generate({"--model", kDir}, "t2i", {"--output", path("fox.png")});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["files"], Json::array({path("fox.png")}));
  // diffusers' numpy_to_pil: (x * 255).round() of its float images.
  const auto expected = (reference("t2i_images")[0] * 255).round().to(at::kShort);
  const auto diff = (read_png(path("fox.png")).to(at::kShort) - expected).abs();
  EXPECT_LE(diff.max().item<int64_t>(), 1);
  EXPECT_LE(diff.gt(0).sum().item<int64_t>(), 3) << "only pixels on a rounding edge may differ";
}

TEST_F(GenerateImage, SeveralImagesGoToNumberedPngs) {
  const Json j = generate({"--model", kDir}, "cfg", {"--output", path("fox.png")});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["files"], Json::array({path("fox_0000.png"), path("fox_0001.png")}));
  const auto expected = reference("cfg_images");
  for (int64_t i = 0; i < 2; ++i) {
    const auto png = read_png(j["files"][i].get<std::string>()).to(at::kShort);
    EXPECT_LE((png - (expected[i] * 255).round().to(at::kShort)).abs().max().item<int64_t>(), 1);
  }
  EXPECT_FALSE(fs::exists(path("fox.png")));
}

TEST_F(GenerateImage, OffloadAndWorkerGiveTheSameImages) {
  const Json plain = generate({"--model", kDir}, "cfg", {"--output", path("plain.npy")});
  ASSERT_FALSE(plain.is_null());
  const at::Tensor expected = read_npy(path("plain.npy"));
  const Json model =
      generate({"--model", kDir}, "cfg", {"--enable-cpu-offload", "--output", path("model.npy")});
  ASSERT_FALSE(model.is_null());
  EXPECT_EQ(model["offload"]["stage 0 (qwen_image)"]["strategy"], "model");
  EXPECT_TRUE(at::equal(read_npy(path("model.npy")), expected));
  const Json layerwise = generate({"--model", kDir}, "cfg",
                                  {"--enable-layerwise-offload", "--layerwise-num-gpu-layers", "2",
                                   "--output", path("layerwise.npy")});
  ASSERT_FALSE(layerwise.is_null());
  EXPECT_EQ(layerwise["offload"]["stage 0 (qwen_image)"]["strategy"], "layerwise");
  EXPECT_TRUE(at::equal(read_npy(path("layerwise.npy")), expected));
  const Json worker = generate({"--stage-configs-path", std::string(OMNI_SOURCE_DIR) +
                                                            "/stage_configs/qwen_image_tiny.yaml"},
                               "cfg", {"--output", path("worker.npy")});
  ASSERT_FALSE(worker.is_null());
  EXPECT_EQ(worker["timings"]["step_ms"].size(), 3u) << "progress packets cross the wire";
  EXPECT_TRUE(at::equal(read_npy(path("worker.npy")), expected));
}

TEST_F(GenerateImage, FlagsTheModelDoesNotReadAreRefused) {
  EXPECT_NE(error_of({"--num-frames", "5"}).find("--num-frames"), std::string::npos);
  EXPECT_NE(error_of({"--guidance-scale", "3"}).find("--guidance-scale"), std::string::npos);
  EXPECT_NE(error_of({"--max-tokens", "3"}).find("--max-tokens"), std::string::npos);
  EXPECT_NE(error_of({"--output", path("x.mp4")}).find(".png or .npy"), std::string::npos);
  EXPECT_NE(error_of({"--height", "40"}).find("height"), std::string::npos);
  // And the image flags on a video model.
  const process::ProcessResult r =
      process::run_process({OMNI_VLLM_OMNI, "generate", "--model",
                            std::string(OMNI_FIXTURES_DIR) + "/wan21_pipeline_tiny", "--prompt",
                            "x", "--true-cfg-scale", "4"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--true-cfg-scale"), std::string::npos) << r.err;
}

// Qwen-Image-Edit and Edit-Plus (qwen_image_edit_pipeline_tiny and its plus/): --image gives
// the image(s) to edit; the .npy is diffusers' (make_qwen_image_edit_pipeline_fixture.py's
// cases), the same under model-level offload.
const std::string kEditDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_edit_pipeline_tiny";

std::vector<std::string> edit_args(const std::string& c) {
  std::vector<std::string> args = {OMNI_VLLM_OMNI,
                                   "generate",
                                   "--model",
                                   c == "edit" ? kEditDir : kEditDir + "/plus",
                                   "--prompt",
                                   "Make the fox blue, keep the café.",
                                   "--num-inference-steps",
                                   "2",
                                   "--image",
                                   kEditDir + "/image_a.png",
                                   "--json"};
  if (c == "edit") {
    args.insert(args.end(), {"--negative-prompt", "blurry, low quality", "--height", "32",
                             "--width", "48", "--seed", "5"});
  } else {
    args.insert(args.end(), {"--image", kEditDir + "/image_b.png", "--height", "48", "--width",
                             "32", "--seed", "9", "--num-images", "2"});
  }
  return args;
}

TEST_F(GenerateImage, EditsEqualDiffusers) {
  const auto ref = models::SafetensorsFile::open(kEditDir + "/reference.safetensors");
  for (const char* c : {"edit", "plus"}) {
    auto args = edit_args(c);
    const std::string npy = path(std::string(c) + ".npy");
    args.insert(args.end(), {"--output", npy});
    const process::ProcessResult r = process::run_process(args);
    ASSERT_EQ(r.status, 0) << c << ": " << r.err;
    EXPECT_LE(max_abs_diff(read_npy(npy), ref.tensor(std::string(c) + "_images")), 1e-4) << c;
  }
  // Model-level offload: the vision tower and the decoder take turns with the transformer.
  auto args = edit_args("edit");
  args.insert(args.end(), {"--enable-cpu-offload", "--output", path("edit_offload.npy")});
  ASSERT_EQ(process::run_process(args).status, 0);
  EXPECT_TRUE(at::equal(read_npy(path("edit_offload.npy")), read_npy(path("edit.npy"))));
}

TEST_F(GenerateImage, ImageCountsTheModelCannotTakeAreRefused) {
  // A text-to-image folder takes no image, before it loads.
  EXPECT_NE(error_of({"--image", kEditDir + "/image_a.png"}).find("from text only"),
            std::string::npos);
  // Edit takes one.
  auto two = edit_args("edit");
  two.insert(two.end(), {"--image", kEditDir + "/image_b.png", "--output", path("x.npy")});
  process::ProcessResult r = process::run_process(two);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("edits at most 1 image, got 2"), std::string::npos) << r.err;
  // And needs one: the stage says so.
  r = process::run_process({OMNI_VLLM_OMNI, "generate", "--model", kEditDir, "--prompt", "x",
                            "--num-inference-steps", "2", "--output", path("y.npy")});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("edits one image, 0 given"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("y.npy")));
}

}  // namespace
}  // namespace omni::cli
