// Offload of the whole Qwen3-Omni model through the stage pipeline as `generate --model` and
// `serve --model` run it: every component name docs/offload.md documents, whole stages taking turns
// on their device, and layerwise streaming of both decoders give the same text, codes and
// waveform (bitwise) as no offload, on the simulated device and on CUDA; the stage holding the
// named parts streamed them, and its device peak fell.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/speech_runners.h"
#include "tiny_request.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/local_pipeline.h"

namespace omni::pipeline {
namespace {

using offload::DeviceKind;
using Json = nlohmann::json;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
const char* const kThinker = "stage 0 (thinker)";
const char* const kTalker = "stage 1 (talker)";

// Text + audio + image in, text + speech out: every part of the model runs.
Request request() { return testing::tiny_request(kDir); }

struct Answer {
  PipelineResult result;
  Json stats;  // Pipeline::stats_json after the request
};

Answer run(DeviceKind kind, const config::EngineFlags& flags) {
  const std::string device = offload::to_string(kind);
  auto config = checkpoint_stage_config(kDir, device, "auto");
  config::apply_stage_flags(config, flags, "");
  auto pipeline = make_local_pipeline(config, device);
  Answer r;
  r.result = pipeline->generate(request());
  r.stats = Json::parse(pipeline->stats_json());
  return r;
}

const Answer& baseline(DeviceKind kind) {
  static std::map<DeviceKind, Answer> cache;
  auto it = cache.find(kind);
  if (it == cache.end()) it = cache.emplace(kind, run(kind, {})).first;
  return it->second;
}

struct Case {
  std::string label;
  std::vector<std::string> components;  // empty: layerwise
  std::string strategy = "alternating";
  // The stages that hold the named parts. With stage names, those stages take turns on the
  // device (the device ledger evicts one for the other); with module names, the stage streams
  // them through its own offload.
  std::vector<std::string> stages;
  bool whole_stages = false;
};

std::vector<Case> cases() {
  return {
      {"thinker_talker", {"thinker", "talker"}, "alternating", {kThinker, kTalker}, true},
      {"talker_code2wav", {"talker", "code2wav"}, "alternating", {kTalker}, true},
      {"thinker_star", {"thinker.*"}, "alternating", {kThinker}},
      {"visual_audio_tower", {"visual", "audio_tower"}, "sequential", {kThinker}},
      {"language_model", {"language_model"}, "sequential", {kThinker}},
      {"lm_head", {"lm_head"}, "sequential", {kThinker}},
      {"language_model_layers", {"language_model.layers.*"}, "sequential", {kThinker}},
      {"code_predictor", {"code_predictor"}, "sequential", {kTalker}},
      {"talker_layers", {"talker.model.layers.*"}, "sequential", {kTalker}},
      {"talker_star", {"talker.*"}, "sequential", {kTalker}},
      // The talker streams its layers too, but its two fit the window of two slots: the
      // thinker's three show the lower peak.
      {"layerwise", {}, "", {kThinker}},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class PipelineOffload : public ::testing::TestWithParam<std::tuple<DeviceKind, Case>> {};

TEST_P(PipelineOffload, SameTextCodesAndWaveformWithTheNamedPartsStreamed) {
  const auto [kind, c] = GetParam();
  OMNI_SKIP_IF_DEVICE_MISSING(kind);
  const Answer& b = baseline(kind);
  ASSERT_GE(b.result.audio.codes.size(1), 4);
  config::EngineFlags flags;
  if (c.components.empty()) {
    flags = {config::engine_flag("enable_layerwise_offload", {"true"})};
  } else {
    flags = {config::engine_flag("cpu_offload_components", c.components),
             config::engine_flag("cpu_offload_strategy", {c.strategy})};
  }
  const Answer got = run(kind, flags);
  EXPECT_EQ(got.result.tokens, b.result.tokens);
  EXPECT_TRUE(at::equal(got.result.audio.codes, b.result.audio.codes));
  EXPECT_TRUE(at::equal(got.result.audio.waveform, b.result.audio.waveform));
  for (const std::string& stage : c.stages) {
    SCOPED_TRACE(stage);
    const Json& s = got.stats[stage];
    const uint64_t baseline_peak = b.stats[stage]["peak_device_bytes"].get<uint64_t>();
    EXPECT_NE(s["strategy"], "none") << s.dump();
    EXPECT_GE(s["loads"].get<uint64_t>(), 1u) << s.dump();
    if (c.whole_stages) continue;
    if (c.strategy == "sequential") {
      // Each part left right after its forward: only the resident weights remain.
      EXPECT_EQ(s["current_device_bytes"], s["resident_bytes"]) << s.dump();
      EXPECT_LT(s["resident_bytes"].get<uint64_t>(), baseline_peak) << s.dump();
    } else {
      // The named parts (or layers) took turns: never all on the device at once.
      EXPECT_LT(s["peak_device_bytes"].get<uint64_t>(), baseline_peak) << s.dump();
    }
  }
  if (c.components.empty()) {
    EXPECT_EQ(got.stats[kTalker]["strategy"], "layerwise");
  }
  if (c.whole_stages) {
    // The stages named took turns: the device never held them all, and one made room.
    ASSERT_TRUE(got.stats.contains("device_ledger")) << got.stats.dump();
    const Json& ledger = got.stats["device_ledger"].begin().value();
    uint64_t all = 0;
    for (const auto& [name, s] : ledger["stages"].items()) all += s["bytes"].get<uint64_t>();
    EXPECT_LT(ledger["budget"].get<uint64_t>(), all) << ledger.dump();
    EXPECT_GE(ledger["evictions"].get<uint64_t>(), 1u) << ledger.dump();
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DeviceKind, Case>>& info) {
  return offload::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param).label;
}

INSTANTIATE_TEST_SUITE_P(Names, PipelineOffload,
                         ::testing::Combine(::testing::ValuesIn(testing::all_devices()),
                                            ::testing::ValuesIn(cases())),
                         case_name);

TEST(PipelineOffloadNames, EachStageTakesItsShareOfTheNamesAndUnknownNamesAreRefused) {
  const std::vector<std::string> names = {"thinker.*",
                                          "visual",
                                          "thinker.audio_tower",
                                          "language_model",
                                          "language_model.layers.*",
                                          "lm_head",
                                          "code_predictor",
                                          "talker.model.layers.*"};
  EXPECT_EQ(models::thinker_stage_component_names(names),
            (std::vector<std::string>{"thinker.*", "visual", "thinker.audio_tower",
                                      "language_model", "language_model.layers.*", "lm_head"}));
  EXPECT_EQ(models::talker_stage_component_paths(names),
            (std::vector<std::string>{"code_predictor", "model.layers.*"}));
  EXPECT_NO_THROW(models::check_component_names(names));
  const config::EngineFlags flags = {config::engine_flag("cpu_offload_components", {"vocoder"})};
  auto config = checkpoint_stage_config(kDir, "cpu", "auto");
  config::apply_stage_flags(config, flags, "");
  try {
    make_local_pipeline(config, "cpu");
    FAIL() << "an unknown component must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'vocoder'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni::pipeline
