// Offload of the whole Qwen3-Omni model (thinker, talker, code2wav) in one process: every
// component name the README documents, the thinker/talker alternation and layerwise streaming of
// both decoders must give the same text, codes and waveform (bitwise) as no offload, with the
// named parts streamed (their units exist, they were loaded) and a lower peak.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "../common/test_devices.h"
#include "../common/unit_stats.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/omni_runner.h"

namespace omni::models {
namespace {

using offload::DeviceKind;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

// Text + audio + image in, text + speech out: every part of the model runs.
OmniRequest request() {
  OmniRequest r;
  r.chat.system_prompt = "You are a helpful voice.";
  r.chat.text = "What do you hear and see?";
  r.chat.audio_files = {kDir + "/audio.wav"};
  r.chat.image_files = {kDir + "/image.png"};
  r.sampling.set_greedy(true);
  r.sampling.thinker.max_new_tokens = 12;
  r.max_audio_frames = 10;
  return r;
}

std::unique_ptr<OmniRunner> load(DeviceKind kind, const OmniOffloadOptions& offload = {}) {
  OmniRunnerOptions options;
  options.model_dir = kDir;
  options.offload = offload;
  return OmniRunner::load(options, offload::make_transfer_engine(kind));
}

struct Baseline {
  OmniResult result;
  size_t peak = 0;
};

const Baseline& baseline(DeviceKind kind) {
  static std::map<DeviceKind, Baseline> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  auto runner = load(kind);
  Baseline b;
  b.result = runner->generate(request());
  b.peak = runner->offload().stats().peak_device_bytes;
  return cache.emplace(kind, b).first->second;
}

struct Case {
  std::string label;
  std::vector<std::string> components;  // empty: layerwise
  std::string strategy = "alternating";
  std::vector<std::string> units;  // units the plan must have (a subset)
};

std::vector<Case> cases() {
  return {
      {"thinker_talker", {"thinker", "talker"}, "alternating", {"thinker", "talker"}},
      {"talker_code2wav", {"talker", "code2wav"}, "alternating", {"talker", "code2wav"}},
      {"talker_code2wav_sequential", {"talker", "code2wav"}, "sequential", {"talker", "code2wav"}},
      {"thinker_star",
       {"thinker.*"},
       "alternating",
       {"thinker.audio_tower", "thinker.visual", "thinker.model", "thinker.lm_head"}},
      {"visual_audio_tower",
       {"visual", "audio_tower"},
       "sequential",
       {"thinker.visual", "thinker.audio_tower"}},
      {"language_model", {"language_model"}, "sequential", {"thinker.model"}},
      {"lm_head", {"lm_head"}, "sequential", {"thinker.lm_head"}},
      {"language_model_layers",
       {"language_model.layers.*"},
       "sequential",
       {"thinker.model.layers.0", "thinker.model.layers.2"}},
      {"code_predictor", {"code_predictor"}, "sequential", {"talker.code_predictor"}},
      {"talker_layers",
       {"talker.model.layers.*"},
       "sequential",
       {"talker.model.layers.0", "talker.model.layers.1"}},
      {"talker_star",
       {"talker.*"},
       "sequential",
       {"talker.model", "talker.text_projection", "talker.hidden_projection", "talker.codec_head",
        "talker.code_predictor"}},
      {"code2wav", {"code2wav"}, "sequential", {"code2wav"}},
      {"layerwise", {}, "", {"thinker.model.layers.0", "talker.model.layers.1"}},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class Qwen3OmniSpeechOffload : public ::testing::TestWithParam<std::tuple<DeviceKind, Case>> {};

TEST_P(Qwen3OmniSpeechOffload, SameTextCodesAndWaveformWithTheNamedPartsStreamed) {
  const auto [kind, c] = GetParam();
  OMNI_SKIP_IF_DEVICE_MISSING(kind);
  const auto& b = baseline(kind);
  ASSERT_GE(b.result.codes.size(1), 4);
  OmniOffloadOptions o;
  if (c.components.empty()) {
    o.layerwise = true;
  } else {
    o.cpu_offload_enabled = true;
    o.components = c.components;
    o.strategy = c.strategy;
  }
  auto runner = load(kind, o);
  const auto result = runner->generate(request());
  EXPECT_EQ(result.tokens, b.result.tokens);
  EXPECT_TRUE(at::equal(result.codes, b.result.codes));
  EXPECT_TRUE(at::equal(result.waveform, b.result.waveform));
  const auto s = runner->offload().stats();
  for (const auto& unit : c.units) {
    EXPECT_GE(testing::unit_loads(s, unit), 1u) << unit;
  }
  if (c.strategy == "sequential") {
    // Each part left right after its forward: only the resident weights remain.
    EXPECT_EQ(s.current_device_bytes, s.resident_bytes);
    EXPECT_LT(s.resident_bytes, b.peak);
  } else {
    // The named parts (or layers) took turns: never all on the device at once.
    EXPECT_LT(s.peak_device_bytes, b.peak);
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DeviceKind, Case>>& info) {
  return offload::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param).label;
}

INSTANTIATE_TEST_SUITE_P(Names, Qwen3OmniSpeechOffload,
                         ::testing::Combine(::testing::ValuesIn(testing::all_devices()),
                                            ::testing::ValuesIn(cases())),
                         case_name);

TEST(Qwen3OmniSpeechOffloadNames, UserNamesMapOntoModulePaths) {
  EXPECT_EQ(
      omni_component_paths({"thinker", "talker", "code2wav", "thinker.*", "visual",
                            "thinker.audio_tower", "language_model", "language_model.layers.*",
                            "lm_head", "code_predictor", "talker.model.layers.*"}),
      (std::vector<std::string>{"thinker", "talker", "code2wav", "thinker.*", "thinker.visual",
                                "thinker.audio_tower", "thinker.model", "thinker.model.layers.*",
                                "thinker.lm_head", "talker.code_predictor",
                                "talker.model.layers.*"}));
  EXPECT_THROW(omni_component_paths({""}), Error);
  OmniOffloadOptions o;
  o.cpu_offload_enabled = true;
  o.components = {"vocoder"};
  try {
    load(DeviceKind::kCpuSim, o);
    FAIL() << "an unknown component must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocoder"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni::models
