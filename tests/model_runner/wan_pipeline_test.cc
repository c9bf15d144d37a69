// WanPipeline against diffusers 0.42.1's WanPipeline on three tiny folders
// (make_wan_pipeline_fixture.py): Wan2.2-A14B (two experts, UniPC), Wan2.2-TI2V (z48 VAE,
// per-token timesteps; plus its image-to-video path) and Wan2.1 (FlowMatchEuler). The token
// ids and the initial noise must be identical, the prompt embeddings within 1e-4, every
// transformer output, every step's latents and the frames within kDiffusersAcrossCpus. Folders
// whose parts disagree and invalid requests must fail naming what is wrong.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/diffusers_reference.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::error_of;

const std::string kFixtures = OMNI_FIXTURES_DIR;

Json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& json) { std::ofstream(path) << json.dump(2); }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

WanRequest request_from(const Json& j) {
  WanRequest r;
  r.prompt = j.at("prompt").get<std::string>();
  r.negative_prompt = j.at("negative_prompt").get<std::string>();
  r.height = j.at("height").get<int64_t>();
  r.width = j.at("width").get<int64_t>();
  r.num_frames = j.at("num_frames").get<int64_t>();
  r.num_inference_steps = j.at("num_inference_steps").get<int64_t>();
  r.guidance_scale = j.at("guidance_scale").get<double>();
  if (!j.at("guidance_scale_2").is_null())
    r.guidance_scale_2 = j.at("guidance_scale_2").get<double>();
  r.seed = j.at("seed").get<uint64_t>();
  r.max_sequence_length = j.at("max_sequence_length").get<int64_t>();
  return r;
}

// What a generate() passed through its trace, by the reference's key names.
struct Recorded {
  std::map<std::string, at::Tensor> tensors;
  std::vector<std::string> experts;
  WanTrace trace;

  Recorded() {
    trace.prompt = [this](bool negative, const at::Tensor& ids, const at::Tensor& mask,
                          const at::Tensor& embeds) {
      const std::string p = negative ? "negative" : "prompt";
      tensors[p + "_ids"] = ids.clone();
      tensors[p + "_mask"] = mask.clone();
      tensors[negative ? "negative_prompt_embeds" : "prompt_embeds"] = embeds.clone();
    };
    trace.initial_latents = [this](const at::Tensor& x) { tensors["initial_latents"] = x.clone(); };
    trace.transformer = [this](int64_t step, bool cond, const at::Tensor& input,
                               const at::Tensor& timestep, const at::Tensor& output) {
      const std::string s = "step" + std::to_string(step) + "_";
      tensors[s + (cond ? "cond" : "uncond")] = output.clone();
      tensors[s + "input"] = input.clone();
      tensors[s + "timestep"] = timestep.to(at::kFloat).clone();
    };
    trace.step_latents = [this](int64_t step, const at::Tensor& x) {
      tensors["step" + std::to_string(step) + "_latents"] = x.clone();
    };
  }
};

// Runs `request` and compares everything with the reference keys under `prefix`.
void expect_matches(WanPipeline& pipe, WanRequest request, const SafetensorsFile& ref,
                    const std::string& prefix, const std::string& label,
                    std::vector<std::string>* experts = nullptr) {
  Recorded rec;
  request.trace = &rec.trace;
  const auto result = pipe.generate(request, [&](const WanStep& step) {
    if (experts) experts->push_back(step.transformer);
    return true;
  });
  ASSERT_FALSE(result.cancelled);
  for (const char* key : {"prompt_ids", "prompt_mask", "negative_ids", "negative_mask"})
    EXPECT_TRUE(at::equal(rec.tensors.at(key), ref.tensor(key))) << label << " " << key;
  for (const char* key : {"prompt_embeds", "negative_prompt_embeds"}) {
    const double diff = max_abs_diff(rec.tensors.at(key), ref.tensor(key));
    EXPECT_LE(diff, 1e-4) << label << " " << key;
  }
  EXPECT_TRUE(at::equal(rec.tensors.at("initial_latents").cpu(), ref.tensor("initial_latents")))
      << label << ": the initial noise must be torch's CPU normal stream for the seed";
  double worst_step = 0;
  for (int64_t i = 0; i < request.num_inference_steps; ++i) {
    const std::string s = "step" + std::to_string(i) + "_";
    for (const char* part : {"input", "timestep", "cond", "uncond", "latents"}) {
      const std::string key = s + part;
      ASSERT_TRUE(rec.tensors.count(key)) << label << " " << key;
      const double diff = max_abs_diff(rec.tensors.at(key), ref.tensor(prefix + key));
      EXPECT_LE(diff, omni::testing::kDiffusersAcrossCpus) << label << " " << key;
      worst_step = std::max(worst_step, diff);
    }
  }
  const auto expected = ref.tensor(prefix + "frames");
  ASSERT_EQ(result.frames.sizes(), expected.sizes());
  EXPECT_EQ(result.frames.scalar_type(), at::kFloat);
  const double frames_diff = max_abs_diff(result.frames, expected);
  EXPECT_LE(frames_diff, omni::testing::kDiffusersAcrossCpus) << label;
  std::cout << label << ": max abs diff per-step " << worst_step << ", frames " << frames_diff
            << " (frames mean " << expected.mean().item<double>() << ")\n";
}

class WanPipelineParity : public ::testing::TestWithParam<std::string> {};

TEST_P(WanPipelineParity, MatchesDiffusers) {
  const std::string dir = kFixtures + "/" + GetParam();
  const auto pipe = load_wan_pipeline(dir, at::kFloat);
  const auto ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const Json json = read_json(dir + "/reference.json");
  std::vector<std::string> experts;
  expect_matches(*pipe, request_from(json), ref, "", GetParam(), &experts);
  if (pipe->transformer_2()) {
    // 999 >= 875 runs the high-noise expert, 750 the low-noise one (with guidance_scale_2).
    EXPECT_EQ(experts, (std::vector<std::string>{"transformer", "transformer_2"}));
  } else {
    EXPECT_EQ(experts, (std::vector<std::string>{"transformer", "transformer"}));
  }
  if (json.at("image").get<bool>()) {
    WanRequest request = request_from(json);
    request.image = ref.tensor("image");
    expect_matches(*pipe, request, ref, "i2v_", GetParam() + " (image-to-video)");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, WanPipelineParity,
                         ::testing::Values("wan22_a14b_pipeline_tiny", "wan22_ti2v_pipeline_tiny",
                                           "wan21_pipeline_tiny"));

// bfloat16 must run through every cast (the scheduler keeps the model output's dtype, the image
// latent is float32). No tight reference: on these random tiny models diffusers' own bfloat16
// frames are up to 1.0 (mean 0.07) away from its float32 ones, and ours as far from its
// bfloat16 ones, so only the mean distance to float32 is bounded (all-grey frames are ~0.3).
TEST(WanPipeline, Bfloat16RunsEveryLayout) {
  for (const char* name :
       {"wan22_a14b_pipeline_tiny", "wan22_ti2v_pipeline_tiny", "wan21_pipeline_tiny"}) {
    const std::string dir = kFixtures + "/" + name;
    const auto pipe = load_wan_pipeline(dir, at::kBFloat16);
    const auto ref = SafetensorsFile::open(dir + "/reference.safetensors");
    const Json json = read_json(dir + "/reference.json");
    WanRequest request = request_from(json);
    std::string prefix;
    if (json.at("image").get<bool>()) {
      request.image = ref.tensor("image");
      prefix = "i2v_";
    }
    const auto frames = pipe->generate(request).frames;
    ASSERT_EQ(frames.scalar_type(), at::kFloat);
    ASSERT_EQ(frames.sizes(), ref.tensor(prefix + "frames").sizes());
    EXPECT_TRUE(frames.isfinite().all().item<bool>()) << name;
    EXPECT_GE(frames.min().item<double>(), 0.0) << name;
    EXPECT_LE(frames.max().item<double>(), 1.0) << name;
    const double diff = (frames - ref.tensor(prefix + "frames")).abs().mean().item<double>();
    std::cout << name << " bfloat16: frames mean abs diff to float32 diffusers " << diff << "\n";
    EXPECT_LE(diff, 0.15) << name;
  }
}

TEST(WanPipeline, ChildrenAreTheOffloadComponents) {
  const auto pipe = load_wan_pipeline(kFixtures + "/wan22_a14b_pipeline_tiny", at::kFloat);
  std::vector<std::string> names;
  for (const auto& child : pipe->named_children()) names.push_back(child.key());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"text_encoder", "transformer", "transformer_2", "vae"}));
  const auto one = load_wan_pipeline(kFixtures + "/wan21_pipeline_tiny", at::kFloat);
  EXPECT_EQ(one->named_children().size(), 3u);
  EXPECT_EQ(one->transformer_2(), nullptr);
}

TEST(WanPipeline, CallbackCancels) {
  const std::string dir = kFixtures + "/wan21_pipeline_tiny";
  const auto pipe = load_wan_pipeline(dir, at::kFloat);
  int calls = 0;
  const auto result =
      pipe->generate(request_from(read_json(dir + "/reference.json")), [&](const WanStep& step) {
        ++calls;
        EXPECT_EQ(step.total, 2);
        return false;
      });
  EXPECT_TRUE(result.cancelled);
  EXPECT_FALSE(result.frames.defined());
  EXPECT_EQ(calls, 1);
}

TEST(WanPipeline, InvalidRequestsNameTheField) {
  const std::string dir = kFixtures + "/wan21_pipeline_tiny";
  const auto pipe = load_wan_pipeline(dir, at::kFloat);
  const WanRequest good = request_from(read_json(dir + "/reference.json"));
  auto bad = good;
  bad.height = 24;
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("WanRequest.height"), std::string::npos);
  bad = good;
  bad.num_frames = 8;
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("WanRequest.num_frames must be 4k + 1"),
            std::string::npos);
  bad = good;
  bad.guidance_scale_2 = 2.0;
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("guidance_scale_2 needs a boundary_ratio"),
            std::string::npos);
  bad = good;
  bad.image = at::zeros({16, 16, 3}, at::kByte);
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("WanRequest.image needs a TI2V folder"),
            std::string::npos);
  bad = good;
  bad.boundary_ratio = 0.5;
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("has no transformer_2"), std::string::npos);
  bad = good;
  bad.num_inference_steps = 0;
  EXPECT_NE(error_of([&] { pipe->validate(bad); }).find("num_inference_steps"), std::string::npos);

  const std::string ti2v = kFixtures + "/wan22_ti2v_pipeline_tiny";
  const auto ti2v_pipe = load_wan_pipeline(ti2v, at::kFloat);
  bad = request_from(read_json(ti2v + "/reference.json"));
  bad.image = at::zeros({16, 32, 3}, at::kByte);
  EXPECT_NE(error_of([&] { ti2v_pipe->validate(bad); }).find("resizing is not supported"),
            std::string::npos);
  bad.height = 16;
  EXPECT_NE(error_of([&] { ti2v_pipe->validate(bad); }).find("multiple of 16 and of 32"),
            std::string::npos);
}

TEST(WanPipeline, FlowShiftOverrideRebuildsTheScheduler) {
  const auto pipe = load_wan_pipeline(kFixtures + "/wan22_a14b_pipeline_tiny", at::kFloat);
  auto base = pipe->make_scheduler(std::nullopt);
  auto shifted = pipe->make_scheduler(12.0);
  base->set_timesteps(4);
  shifted->set_timesteps(4);
  EXPECT_FALSE(at::equal(base->sigmas(), shifted->sigmas()));
}

// A copy of a fixture folder to break one thing in.
class WanPipelineBrokenFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("wan_pipeline_broken_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(kFixtures + "/wan22_a14b_pipeline_tiny", dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string load_error() {
    return error_of([&] { load_wan_pipeline(dir_.string(), at::kFloat); });
  }
  void edit_json(const std::string& file, const std::function<void(Json&)>& edit) {
    Json j = read_json((dir_ / file).string());
    edit(j);
    write_json((dir_ / file).string(), j);
  }
  fs::path dir_;
};

TEST_F(WanPipelineBrokenFolder, MissingVaeFolder) {
  fs::remove_all(dir_ / "vae");
  EXPECT_NE(load_error().find("names 'vae' but the folder"), std::string::npos) << load_error();
}

TEST_F(WanPipelineBrokenFolder, MissingModelIndex) {
  fs::remove(dir_ / "model_index.json");
  EXPECT_NE(load_error().find("model_index.json is missing"), std::string::npos) << load_error();
}

TEST_F(WanPipelineBrokenFolder, ImageToVideoPipelineIsRefused) {
  edit_json("model_index.json", [](Json& j) { j["_class_name"] = "WanImageToVideoPipeline"; });
  EXPECT_NE(load_error().find("WanImageToVideoPipeline is not supported"), std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, BoundaryWithoutSecondExpert) {
  edit_json("model_index.json", [](Json& j) {
    j["transformer_2"] = Json::array({nullptr, nullptr});
  });
  EXPECT_NE(load_error().find("boundary_ratio is set but transformer_2 is null"), std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, LatentChannelsDisagree) {
  edit_json("vae/config.json", [](Json& j) {
    j["z_dim"] = 48;
    j["latents_mean"] = std::vector<double>(48, 0.0);
    j["latents_std"] = std::vector<double>(48, 1.0);
  });
  EXPECT_NE(
      load_error().find("transformer/config.json: in_channels 16 != vae/config.json z_dim 48"),
      std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, TextWidthDisagrees) {
  edit_json("transformer_2/config.json", [](Json& j) { j["text_dim"] = 64; });
  EXPECT_NE(load_error().find(
                "transformer_2/config.json: text_dim 64 != text_encoder/config.json d_model 32"),
            std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, ExpandTimestepsNeedsTheTwoByTwoPatch) {
  edit_json("model_index.json", [](Json& j) { j["expand_timesteps"] = true; });
  edit_json("transformer/config.json", [](Json& j) { j["patch_size"] = Json::array({1, 1, 1}); });
  EXPECT_NE(
      load_error().find("patch_size must be [1, 2, 2] with model_index.json expand_timesteps"),
      std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, ASchedulerThatShiftsByTheImagesSizeIsRefused) {
  write_json(
      (dir_ / "scheduler" / "scheduler_config.json").string(),
      Json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"use_dynamic_shifting", true}});
  EXPECT_NE(load_error().find("scheduler_config.json: use_dynamic_shifting = true is not "
                              "supported by the Wan pipeline"),
            std::string::npos)
      << load_error();
}

TEST_F(WanPipelineBrokenFolder, MissingSchedulerConfig) {
  fs::remove(dir_ / "scheduler" / "scheduler_config.json");
  EXPECT_NE(load_error().find("scheduler"), std::string::npos) << load_error();
}

}  // namespace
}  // namespace omni::models
