// The diffusion stage kind through the orchestrator, in this process, on the tiny diffusers
// folders of tests/fixtures (make_wan_pipeline_fixture.py): a folder given as --model becomes
// one diffusion stage whose frames match diffusers' (reference.safetensors), one progress
// packet per step; its parameters survive the JSON a worker receives; a callback cancels between
// steps; model-level and layerwise offload give the same frames; a bad request names the field;
// the encode / denoise / decode split (stage_configs/wan_tiny_3stage.yaml) gives the one
// stage's frames bit for bit, and its progress and cancellation.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_runner/weights/safetensors.h"
#include "worker/diffusers/diffusion_params.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/pipeline.h"

#ifdef OMNI_STAGE_YAML
#include "worker/config/stage_yaml.h"
#endif

namespace omni::pipeline {
namespace {

using Json = nlohmann::json;

std::string fixture(const std::string& name) { return std::string(OMNI_FIXTURES_DIR) + "/" + name; }

// The request reference.json describes (what the fixture's generator gave diffusers).
Request reference_request(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  const Json j = Json::parse(in);
  Request r;
  r.audio_output = false;
  r.chat.text = j.at("prompt").get<std::string>();
  auto& d = r.parts.get<models::DiffusionRequest>();
  d.negative_prompt = j.at("negative_prompt").get<std::string>();
  d.height = j.at("height").get<int64_t>();
  d.width = j.at("width").get<int64_t>();
  d.num_frames = j.at("num_frames").get<int64_t>();
  d.num_inference_steps = j.at("num_inference_steps").get<int64_t>();
  d.guidance_scale = j.at("guidance_scale").get<double>();
  if (!j.at("guidance_scale_2").is_null())
    d.guidance_scale_2 = j.at("guidance_scale_2").get<double>();
  d.seed = j.at("seed").get<uint64_t>();
  d.max_sequence_length = j.at("max_sequence_length").get<int64_t>();
  return r;
}

at::Tensor reference_frames(const std::string& dir) {
  return models::SafetensorsFile::open(dir + "/reference.safetensors").tensor("frames");
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::unique_ptr<Pipeline> folder_pipeline(const std::string& dir,
                                          void (*edit)(config::StageConfig&) = nullptr) {
  auto config = checkpoint_stage_config(dir, "cpu", "auto");
  if (edit) edit(config.stages.at(0));
  return make_local_pipeline(config, "cpu");
}

class DiffusionPipeline : public ::testing::TestWithParam<std::string> {};

TEST_P(DiffusionPipeline, FolderGivesOneStageWithDiffusersFrames) {
  const std::string dir = fixture(GetParam());
  const auto config = checkpoint_stage_config(dir, "cpu", "auto");
  ASSERT_EQ(config.stages.size(), 1u);
  EXPECT_EQ(config.stages[0].engine.model_stage, "diffusion");
  EXPECT_EQ(config.stages[0].stage_type, "diffusion");
  EXPECT_EQ(config.stages[0].final_output_type, "image");

  auto pipeline = make_local_pipeline(config, "cpu");
  EXPECT_TRUE(pipeline->has_video());
  EXPECT_FALSE(pipeline->has_speech());
  const auto request = reference_request(dir);
  std::vector<std::map<std::string, double>> progress;
  PipelineCallbacks callbacks;
  callbacks.on_progress = [&](const std::map<std::string, double>& m) {
    progress.push_back(m);
    return true;
  };
  const PipelineResult r = pipeline->generate(request, callbacks);
  const auto expected = reference_frames(dir);
  ASSERT_TRUE(r.video.defined());
  EXPECT_EQ(r.video.scalar_type(), at::kFloat);
  EXPECT_LE(max_abs_diff(r.video, expected), 1e-4) << GetParam();
  EXPECT_EQ(r.video_fps, 16);
  EXPECT_EQ(r.finish_reason, "stop");

  const int64_t steps = *request.parts.value<models::DiffusionRequest>().num_inference_steps;
  ASSERT_EQ(static_cast<int64_t>(progress.size()), steps);
  EXPECT_EQ(r.progress_packets, steps);
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_EQ(progress[i].at("step"), i + 1);
    EXPECT_EQ(progress[i].at("steps"), steps);
    EXPECT_TRUE(progress[i].count("timestep"));
    EXPECT_GE(progress[i].at("step_ms"), 0.0);
  }
  const auto& m = r.stage_metrics.at("stage 0 (diffusion)");
  for (const char* key : {"load_ms", "generate_ms", "step_ms_mean", "decode_ms", "fps"}) {
    EXPECT_TRUE(m.count(key)) << key;
  }
  EXPECT_EQ(Json::parse(pipeline->stats_json())["stage 0 (diffusion)"]["strategy"], "none");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DiffusionPipeline,
                         ::testing::Values("wan21_pipeline_tiny", "wan22_a14b_pipeline_tiny"));

// A worker gets the parameters as JSON: the stage reads them back to the same frames.
TEST(DiffusionStage, JsonParametersGiveTheSameFrames) {
  const std::string dir = fixture("wan22_a14b_pipeline_tiny");
  const auto request = reference_request(dir);
  DiffusionParams p;
  p.prompt = request.chat.text;
  p.request = request.parts.value<models::DiffusionRequest>();
  const DiffusionParams back = diffusion_params(p.to_json());
  EXPECT_EQ(back.to_json(), p.to_json());
  EXPECT_EQ(back.request.guidance_scale_2,
            request.parts.value<models::DiffusionRequest>().guidance_scale_2);
  EXPECT_FALSE(back.request.flow_shift.has_value());

  const auto config = checkpoint_stage_config(dir, "cpu", "auto");
  auto stage = make_local_stage(local_stage_options(config.stages[0], "cpu"));
  StageCall call;
  call.params = std::make_shared<JsonParams>(p.to_json());
  PacketQueue input;
  input.close();
  CancelToken cancel;
  std::vector<StagePacket> packets;
  stage->run(
      call, input, [&](StagePacket&& packet) { packets.push_back(std::move(packet)); }, cancel);
  ASSERT_EQ(packets.size(), 3u);  // two steps and the end
  ASSERT_TRUE(packets.back().finished);
  EXPECT_LE(max_abs_diff(packets.back().tensor("frames"), reference_frames(dir)), 1e-4);
  EXPECT_THROW(diffusion_params("{\"height\": 16}"), StageError);  // no prompt
}

TEST(DiffusionStage, CallbackCancelsBetweenSteps) {
  const std::string dir = fixture("wan21_pipeline_tiny");
  auto pipeline = folder_pipeline(dir);
  int calls = 0;
  PipelineCallbacks callbacks;
  callbacks.on_progress = [&](const std::map<std::string, double>&) {
    ++calls;
    return false;
  };
  const PipelineResult r = pipeline->generate(reference_request(dir), callbacks);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(r.video.defined());
  EXPECT_EQ(r.finish_reason, "cancelled");
}

TEST(DiffusionStage, OffloadGivesTheSameFrames) {
  const std::string dir = fixture("wan22_a14b_pipeline_tiny");
  const auto expected = reference_frames(dir);
  for (const bool layerwise : {false, true}) {
    auto pipeline = folder_pipeline(
        dir, layerwise ? +[](config::StageConfig& s) { s.engine.enable_layerwise_offload = true; }
                       : +[](config::StageConfig& s) { s.engine.enable_cpu_offload = true; });
    const PipelineResult r = pipeline->generate(reference_request(dir));
    ASSERT_TRUE(r.video.defined());
    EXPECT_LE(max_abs_diff(r.video, expected), 1e-4) << layerwise;
    const Json stats = Json::parse(pipeline->stats_json())["stage 0 (diffusion)"];
    EXPECT_EQ(stats["strategy"], layerwise ? "layerwise" : "model") << stats.dump();
    // Model-level: the parts take turns, so the device never holds two of them (the experts).
    if (!layerwise) {
      EXPECT_LE(stats["peak_device_bytes"].get<uint64_t>(),
                stats["resident_bytes"].get<uint64_t>() + stats["max_unit_bytes"].get<uint64_t>());
    }
  }
}

TEST(DiffusionStage, BadRequestNamesTheField) {
  const std::string dir = fixture("wan21_pipeline_tiny");
  auto pipeline = folder_pipeline(dir);
  auto request = reference_request(dir);
  request.parts.get<models::DiffusionRequest>().height = 17;
  try {
    pipeline->generate(request);
    FAIL() << "height 17 was accepted";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("height"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stage 0 (diffusion)"), std::string::npos) << e.what();
  }
}

// wan_tiny_3stage.yaml in this process: the one diffusion stage's frames, bitwise; the denoise
// stage's step packets are the progress; a callback cancels the split as it does the one stage.
TEST(DiffusionSplitStages, ThreeStagesGiveTheOneStagesFrames) {
#ifndef OMNI_STAGE_YAML
  GTEST_SKIP() << "built without yaml-cpp";
#else
  const std::string dir = fixture("wan22_a14b_pipeline_tiny");
  const auto request = reference_request(dir);
  const PipelineResult one = folder_pipeline(dir)->generate(request);
  ASSERT_TRUE(one.video.defined());

  const auto config = config::load_pipeline_config(std::string(OMNI_FIXTURES_DIR) +
                                                   "/../../stage_configs/wan_tiny_3stage.yaml");
  ASSERT_EQ(config.stages.size(), 3u);
  auto pipeline = make_local_pipeline(config, "cpu");
  EXPECT_TRUE(pipeline->has_video());
  int64_t progress = 0;
  PipelineCallbacks callbacks;
  callbacks.on_progress = [&](const std::map<std::string, double>& m) {
    EXPECT_EQ(m.at("step"), ++progress);
    return true;
  };
  const PipelineResult three = pipeline->generate(request, callbacks);
  ASSERT_TRUE(three.video.defined());
  EXPECT_TRUE(at::equal(three.video, one.video)) << max_abs_diff(three.video, one.video);
  EXPECT_EQ(three.video_fps, 16);
  EXPECT_EQ(three.finish_reason, "stop");
  EXPECT_EQ(progress, *request.parts.value<models::DiffusionRequest>().num_inference_steps);
  EXPECT_EQ(three.progress_packets, progress);
  EXPECT_TRUE(three.stage_metrics.at("stage 1 (diffusion_denoise)").count("step_ms_mean"));
  EXPECT_TRUE(three.stage_metrics.at("stage 2 (diffusion_decode)").count("decode_ms"));

  callbacks.on_progress = [](const std::map<std::string, double>&) { return false; };
  const PipelineResult cancelled = pipeline->generate(request, callbacks);
  EXPECT_FALSE(cancelled.video.defined());
  EXPECT_EQ(cancelled.finish_reason, "cancelled");
#endif
}

}  // namespace
}  // namespace omni::pipeline
