// `vllm-omni generate` on the tiny diffusers Wan folders (tests/fixtures/wan*_pipeline_tiny),
// run as a user runs it: the .npy it writes is within kDiffusersAcrossCpus of diffusers' frames
// (reference.safetensors), the .mp4 is one ffprobe reads with the frames, size and rate, .png
// writes one file per frame,
// --json reports one step time per step; the stage config wan_tiny.yaml (a gRPC worker) gives
// the same frames, and so does wan_tiny_3stage.yaml (encode / denoise / decode as three gRPC
// workers), bit for bit; flags the model does not read, and bad values, fail naming the flag.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/diffusers_reference.h"
#include "../common/npy_reader.h"
#include "generate_e2e.h"
#include "model_runner/output/frames_writer.h"
#include "model_runner/weights/safetensors.h"
#include "process.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using omni::testing::read_npy;

std::string fixture(const std::string& name) { return std::string(OMNI_FIXTURES_DIR) + "/" + name; }

// The command-line arguments of reference.json's request.
std::vector<std::string> reference_args(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  const Json j = Json::parse(in);
  std::vector<std::string> args = {"--prompt",
                                   j.at("prompt").get<std::string>(),
                                   "--negative-prompt",
                                   j.at("negative_prompt").get<std::string>(),
                                   "--height",
                                   std::to_string(j.at("height").get<int64_t>()),
                                   "--width",
                                   std::to_string(j.at("width").get<int64_t>()),
                                   "--num-frames",
                                   std::to_string(j.at("num_frames").get<int64_t>()),
                                   "--num-inference-steps",
                                   std::to_string(j.at("num_inference_steps").get<int64_t>()),
                                   "--guidance-scale",
                                   j.at("guidance_scale").dump(),
                                   "--seed",
                                   std::to_string(j.at("seed").get<uint64_t>()),
                                   "--max-sequence-length",
                                   std::to_string(j.at("max_sequence_length").get<int64_t>())};
  if (!j.at("guidance_scale_2").is_null()) {
    args.push_back("--guidance-scale-2");
    args.push_back(j.at("guidance_scale_2").dump());
  }
  return args;
}

at::Tensor reference_frames(const std::string& dir) {
  return models::SafetensorsFile::open(dir + "/reference.safetensors").tensor("frames");
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

bool have_ffprobe() { return std::system("ffprobe -version > /dev/null 2>&1") == 0; }

class GenerateVideo : public GenerateE2eTest {
 protected:
  // `generate` with `source` ("--model DIR" or "--stage-configs-path FILE"), the reference's
  // request and `extra`; the JSON it prints.
  Json generate(const std::vector<std::string>& source, const std::string& dir,
                const std::vector<std::string>& extra) {
    std::vector<std::string> args = source;
    for (const auto& a : reference_args(dir)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    return generate_json(args);
  }
};

TEST_F(GenerateVideo, NpyEqualsDiffusersFrames) {
  for (const char* name : {"wan21_pipeline_tiny", "wan22_a14b_pipeline_tiny"}) {
    const std::string dir = fixture(name);
    const std::string npy = path(std::string(name) + ".npy");
    const Json j = generate({"--model", dir}, dir, {"--output", npy});
    ASSERT_FALSE(j.is_null()) << name;
    const at::Tensor expected = reference_frames(dir);
    EXPECT_LE(max_abs_diff(read_npy(npy), expected), omni::testing::kDiffusersAcrossCpus) << name;
    EXPECT_EQ(j["output"], npy);
    EXPECT_EQ(j["frames"], expected.size(0));
    EXPECT_EQ(j["height"], expected.size(1));
    EXPECT_EQ(j["width"], expected.size(2));
    EXPECT_EQ(j["fps"], 16);
    EXPECT_EQ(j["finish_reason"], "stop");
    EXPECT_EQ(j["timings"]["step_ms"].size(), 2u) << "one progress packet per step";
    for (const char* key :
         {"load_ms", "total_ms", "generate_ms", "step_ms_mean", "decode_ms", "write_ms"}) {
      EXPECT_TRUE(j["timings"].contains(key)) << key;
    }
    EXPECT_GT(j["peak_device_bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(j["peak_host_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["offload"]["stage 0 (diffusion)"]["strategy"], "none");
  }
}

TEST_F(GenerateVideo, Mp4IsReadByFfprobe) {
  if (!have_ffprobe()) GTEST_SKIP() << "ffprobe is not installed";
  const std::string dir = fixture("wan21_pipeline_tiny");
  const std::string mp4 = path("out.mp4");
  ASSERT_FALSE(generate({"--model", dir}, dir, {"--output", mp4}).is_null());
  const process::ProcessResult probe = process::run_process(
      {"/usr/bin/env", "ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
       "-show_entries", "stream=codec_name,width,height,r_frame_rate,nb_read_frames", "-of", "json",
       mp4});
  ASSERT_EQ(probe.status, 0) << probe.err;
  const Json stream = Json::parse(probe.out)["streams"][0];
  EXPECT_EQ(stream["codec_name"], "h264");
  EXPECT_EQ(stream["width"], 16);
  EXPECT_EQ(stream["height"], 16);
  EXPECT_EQ(stream["r_frame_rate"], "16/1");
  EXPECT_EQ(stream["nb_read_frames"], "9");
}

TEST_F(GenerateVideo, PngWritesOneFilePerFrame) {
  const std::string dir = fixture("wan21_pipeline_tiny");
  ASSERT_FALSE(generate({"--model", dir}, dir, {"--output", path("frame.png")}).is_null());
  for (int i = 0; i < 9; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "frame_%04d.png", i);
    EXPECT_TRUE(fs::exists(path(name))) << name;
  }
}

// TI2V: --image (a PNG of the reference's uint8 image) conditions the first frame; the folder's
// frame rate is 24.
TEST_F(GenerateVideo, ImageToVideoEqualsDiffusers) {
  const std::string dir = fixture("wan22_ti2v_pipeline_tiny");
  const auto ref = models::SafetensorsFile::open(dir + "/reference.safetensors");
  const std::string png = path("image.png");
  models::write_png(png, (ref.tensor("image").to(at::kFloat) / 255).unsqueeze(0));
  const Json j = generate({"--model", dir}, dir, {"--image", png, "--output", path("i2v.npy")});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["fps"], 24);
  EXPECT_LE(max_abs_diff(read_npy(path("i2v.npy")), ref.tensor("i2v_frames")),
            omni::testing::kDiffusersAcrossCpus);
}

// Model-level offload (--enable-cpu-offload) and the stage config as a gRPC worker: the same
// frames.
TEST_F(GenerateVideo, OffloadAndWorkerGiveTheSameFrames) {
  const std::string dir = fixture("wan22_a14b_pipeline_tiny");
  const at::Tensor expected = reference_frames(dir);
  const Json offload =
      generate({"--model", dir}, dir, {"--enable-cpu-offload", "--output", path("offload.npy")});
  ASSERT_FALSE(offload.is_null());
  EXPECT_EQ(offload["offload"]["stage 0 (diffusion)"]["strategy"], "model");
  EXPECT_LE(max_abs_diff(read_npy(path("offload.npy")), expected),
            omni::testing::kDiffusersAcrossCpus);

  const Json layerwise = generate({"--model", dir}, dir,
                                  {"--enable-layerwise-offload", "--layerwise-num-gpu-layers", "2",
                                   "--output", path("layerwise.npy")});
  ASSERT_FALSE(layerwise.is_null());
  EXPECT_EQ(layerwise["offload"]["stage 0 (diffusion)"]["strategy"], "layerwise");
  EXPECT_LE(max_abs_diff(read_npy(path("layerwise.npy")), expected),
            omni::testing::kDiffusersAcrossCpus);

  const Json worker = generate(
      {"--stage-configs-path", std::string(OMNI_SOURCE_DIR) + "/stage_configs/wan_tiny.yaml"}, dir,
      {"--output", path("worker.npy")});
  ASSERT_FALSE(worker.is_null());
  EXPECT_EQ(worker["timings"]["step_ms"].size(), 2u) << "progress packets cross the wire";
  EXPECT_LE(max_abs_diff(read_npy(path("worker.npy")), expected),
            omni::testing::kDiffusersAcrossCpus);
}

// wan_tiny_3stage.yaml as three gRPC workers gives the in-process one stage's frames bit for
// bit, with one progress packet per step; TI2V through the same three (the folder overridden)
// too, so the image latent crosses the wire.
TEST_F(GenerateVideo, ThreeStageWorkersGiveTheInProcessFrames) {
  const std::string yaml = std::string(OMNI_SOURCE_DIR) + "/stage_configs/wan_tiny_3stage.yaml";
  const std::string dir = fixture("wan22_a14b_pipeline_tiny");
  ASSERT_FALSE(generate({"--model", dir}, dir, {"--output", path("local.npy")}).is_null());
  const Json workers = generate({"--stage-configs-path", yaml}, dir, {"--output", path("3.npy")});
  ASSERT_FALSE(workers.is_null());
  EXPECT_EQ(workers["timings"]["step_ms"].size(), 2u) << "progress packets cross the wire";
  EXPECT_TRUE(at::equal(read_npy(path("3.npy")), read_npy(path("local.npy"))));

  const std::string ti2v = fixture("wan22_ti2v_pipeline_tiny");
  const auto ref = models::SafetensorsFile::open(ti2v + "/reference.safetensors");
  const std::string png = path("image.png");
  models::write_png(png, (ref.tensor("image").to(at::kFloat) / 255).unsqueeze(0));
  const Json model = {{"model", ti2v}};
  const std::string overrides = Json{{"0", model}, {"1", model}, {"2", model}}.dump();
  ASSERT_FALSE(
      generate({"--model", ti2v}, ti2v, {"--image", png, "--output", path("i2v.npy")}).is_null());
  const Json i2v = generate({"--stage-configs-path", yaml, "--stage-overrides", overrides}, ti2v,
                            {"--image", png, "--output", path("i2v_3.npy")});
  ASSERT_FALSE(i2v.is_null());
  EXPECT_EQ(i2v["fps"], 24);
  EXPECT_TRUE(at::equal(read_npy(path("i2v_3.npy")), read_npy(path("i2v.npy"))));
}

// The progress bar is for a terminal (util-linux `script` gives the command one); a pipe gets
// none.
TEST_F(GenerateVideo, ProgressBarOnlyOnATerminal) {
  const std::string dir = fixture("wan21_pipeline_tiny");
  std::string command = std::string(OMNI_VLLM_OMNI) + " generate --model " + dir;
  for (const auto& a : reference_args(dir)) command += " '" + a + "'";
  const process::ProcessResult piped = process::run_process({"/bin/sh", "-c", command});
  ASSERT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.err.find("step 1/2"), std::string::npos) << piped.err;
  if (std::system("script --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1)";
  const process::ProcessResult tty =
      process::run_process({"/usr/bin/env", "script", "-qec", command, "/dev/null"});
  ASSERT_EQ(tty.status, 0) << tty.out;
  for (const char* part : {"step 1/2", "step 2/2", " s/step", "ETA "}) {
    EXPECT_NE(tty.out.find(part), std::string::npos) << part << " in " << tty.out;
  }
}

TEST_F(GenerateVideo, FlagsTheModelDoesNotReadFail) {
  const std::string wan = fixture("wan21_pipeline_tiny");
  const std::string omni = fixture("qwen3_omni_tiny");
  struct Case {
    std::vector<std::string> args;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--model", wan, "--prompt", "x", "--speaker", "ethan"}, 2, "--speaker does not apply"},
      {{"--model", wan, "--prompt", "x", "--output-wav", path("a.wav")},
       2,
       "--output-wav does not apply"},
      {{"--model", omni, "--prompt", "x", "--negative-prompt", "y"},
       2,
       "--negative-prompt does not apply"},
      {{"--model", omni, "--prompt", "x", "--num-frames", "9"}, 2, "--num-frames does not apply"},
      {{"--model", wan, "--prompt", "x", "--output", path("a.gif")}, 2, ".mp4, .png or .npy"},
      {{"--model", wan, "--prompt", "x", "--output", path("no/such/a.npy")}, 2, "does not exist"},
      {{"--model", wan, "--prompt", "x", "--height", "17", "--num-inference-steps", "1"},
       1,
       "height"},
      {{"--model", wan, "--prompt", "x", "--image", omni + "/image.png"}, 1, "TI2V"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {OMNI_VLLM_OMNI, "generate"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const process::ProcessResult r = process::run_process(args);
    EXPECT_EQ(r.status, c.status) << c.says << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << c.says;
  }
}

}  // namespace
}  // namespace omni::cli
