// The Qwen3-Omni thinker's audio tower and vision encoder against the Hugging Face reference
// (tests/fixtures/qwen3_omni_tiny, written by make_qwen3_omni_fixture.py): same checkpoint, same
// inputs, outputs within 1e-4 in float32.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <array>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "model_runner/qwen3_omni/audio_encoder.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/vision_encoder.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models::qwen3_omni {
namespace {

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
constexpr double kTolerance = 1e-4;

struct Fixture {
  ThinkerConfig config;
  SafetensorsCheckpoint checkpoint;
  SafetensorsFile reference;
};

const Fixture& fixture() {
  static const Fixture f{parse_thinker_config(HfConfig::load(kDir)),
                         SafetensorsCheckpoint::open(kDir),
                         SafetensorsFile::open(kDir + "/reference.safetensors")};
  return f;
}

std::shared_ptr<AudioEncoder> load_audio(at::ScalarType dtype = at::kFloat) {
  const auto& f = fixture();
  auto enc = std::make_shared<AudioEncoder>(f.config.audio, dtype);
  load_weights(*enc, f.checkpoint, f.config.weight_prefix + "audio_tower.");
  return enc;
}

std::shared_ptr<VisionEncoder> load_vision(at::ScalarType dtype = at::kFloat) {
  const auto& f = fixture();
  auto enc = std::make_shared<VisionEncoder>(f.config.vision, dtype);
  load_weights(*enc, f.checkpoint, f.config.weight_prefix + "visual.");
  return enc;
}

std::vector<std::array<int64_t, 3>> reference_grid() {
  auto g = fixture().reference.tensor("image_grid_thw").to(at::kLong).contiguous();
  std::vector<std::array<int64_t, 3>> grid;
  for (int64_t i = 0; i < g.size(0); ++i) {
    grid.push_back({g[i][0].item<int64_t>(), g[i][1].item<int64_t>(), g[i][2].item<int64_t>()});
  }
  return grid;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

void report(const std::string& name, double diff) {
  std::cout << "[ max diff ] " << name << ": " << diff << "\n";
  ::testing::Test::RecordProperty(name, std::to_string(diff));
}

// The reference formula (_get_feat_extract_output_lengths) in Python integer arithmetic:
// 100 -> 13, 320 -> 42, 99 -> 13, 1 -> 1, 250 -> 33, 0 -> 0, 200 -> 26, 101 -> 14.
TEST(AudioOutputLength, MatchesReferenceFormula) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {100, 13}, {320, 42}, {99, 13}, {1, 1}, {250, 33}, {0, 0}, {200, 26}, {101, 14}, {3000, 390}};
  for (auto [frames, tokens] : cases) {
    EXPECT_EQ(audio_output_length(frames, 50), tokens) << frames << " mel frames";
  }
}

TEST(AudioEncoder, MatchesReference) {
  const auto& ref = fixture().reference;
  auto enc = load_audio();
  auto features = ref.tensor("input_features");
  at::NoGradGuard no_grad;
  auto out = enc->forward(features, {features.size(1)});
  auto expected = ref.tensor("audio_tower_output");
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  const double diff = max_abs_diff(out, expected);
  report("audio_tower_output", diff);
  EXPECT_LE(diff, kTolerance);
}

// Two clips of different lengths in one call give what each gives alone. Both are at least one
// full chunk (2 * n_window frames) long: the reference pads every chunk of a call to the longest
// one, so a shorter clip alone would see a different padding.
TEST(AudioEncoder, BatchedClipsEqualSeparateClips) {
  const auto& ref = fixture().reference;
  auto enc = load_audio();
  auto features = ref.tensor("input_features");
  auto a = features.narrow(1, 0, 250).contiguous();
  auto b = features.narrow(1, 120, 200).contiguous();
  at::NoGradGuard no_grad;
  auto batched = enc->forward(at::cat({a, b}, 1), {250, 200});
  auto alone_a = enc->forward(a, {250});
  auto alone_b = enc->forward(b, {200});
  ASSERT_EQ(batched.size(0), audio_output_length(250, 50) + audio_output_length(200, 50));
  const double diff_a = max_abs_diff(batched.narrow(0, 0, alone_a.size(0)), alone_a);
  const double diff_b = max_abs_diff(batched.narrow(0, alone_a.size(0), alone_b.size(0)), alone_b);
  report("audio_batched_vs_alone_a", diff_a);
  report("audio_batched_vs_alone_b", diff_b);
  EXPECT_LE(diff_a, 1e-5);
  EXPECT_LE(diff_b, 1e-5);
}

TEST(AudioEncoder, RejectsLengthsThatDoNotCoverTheFeatures) {
  auto enc = load_audio();
  auto features = fixture().reference.tensor("input_features");
  at::NoGradGuard no_grad;
  EXPECT_THROW(enc->forward(features, {100}), omni::Error);
  EXPECT_THROW(enc->forward(features, {320, 0}), omni::Error);
}

TEST(VisionEncoder, MatchesReference) {
  const auto& ref = fixture().reference;
  auto enc = load_vision();
  at::NoGradGuard no_grad;
  auto out = enc->forward(ref.tensor("pixel_values"), reference_grid());
  const double diff = max_abs_diff(out.embeds, ref.tensor("visual_output"));
  report("visual_output", diff);
  EXPECT_LE(diff, kTolerance);
  ASSERT_EQ(out.deepstack.size(), fixture().config.vision.deepstack_visual_indexes.size());
  for (size_t k = 0; k < out.deepstack.size(); ++k) {
    const std::string name = "visual_deepstack_" + std::to_string(k);
    const double d = max_abs_diff(out.deepstack[k], ref.tensor(name));
    report(name, d);
    EXPECT_LE(d, kTolerance);
  }
}

TEST(VisionEncoder, TwoImagesEqualEachAlone) {
  const auto& ref = fixture().reference;
  auto enc = load_vision();
  auto pixels = ref.tensor("pixel_values");
  auto grid = reference_grid();
  at::NoGradGuard no_grad;
  auto alone = enc->forward(pixels, grid);
  // The same image twice, then a 2x2-patch crop-like image (the first merge block's patches).
  auto small = pixels.narrow(0, 0, 4);
  auto both = enc->forward(at::cat({pixels, small}, 0), {grid[0], {1, 2, 2}});
  auto small_alone = enc->forward(small, {{1, 2, 2}});
  const int64_t n = alone.embeds.size(0);
  ASSERT_EQ(both.embeds.size(0), n + 1);
  EXPECT_LE(max_abs_diff(both.embeds.narrow(0, 0, n), alone.embeds), 1e-5);
  EXPECT_LE(max_abs_diff(both.embeds.narrow(0, n, 1), small_alone.embeds), 1e-5);
  for (size_t k = 0; k < alone.deepstack.size(); ++k) {
    EXPECT_LE(max_abs_diff(both.deepstack[k].narrow(0, 0, n), alone.deepstack[k]), 1e-5);
  }
}

// A two-frame video of the same frame: attention stays inside each frame (the frames run as one
// batch of equal segments), so each frame gives what the image gives alone.
TEST(VisionEncoder, VideoFramesAttendOnlyWithinTheirFrame) {
  const auto& ref = fixture().reference;
  auto enc = load_vision();
  auto pixels = ref.tensor("pixel_values");
  auto grid = reference_grid();
  at::NoGradGuard no_grad;
  auto image = enc->forward(pixels, grid);
  auto video = enc->forward(at::cat({pixels, pixels}, 0), {{2, grid[0][1], grid[0][2]}});
  const int64_t n = image.embeds.size(0);
  ASSERT_EQ(video.embeds.size(0), 2 * n);
  for (int64_t frame = 0; frame < 2; ++frame) {
    EXPECT_LE(max_abs_diff(video.embeds.narrow(0, frame * n, n), image.embeds), 1e-5);
    for (size_t k = 0; k < image.deepstack.size(); ++k) {
      EXPECT_LE(max_abs_diff(video.deepstack[k].narrow(0, frame * n, n), image.deepstack[k]), 1e-5);
    }
  }
}

TEST(VisionEncoder, RejectsAGridThatDoesNotMatchThePatches) {
  auto enc = load_vision();
  at::NoGradGuard no_grad;
  auto pixels = fixture().reference.tensor("pixel_values");
  EXPECT_THROW(enc->forward(pixels, {{1, 4, 4}}), omni::Error);
  EXPECT_THROW(enc->forward(pixels, {{1, 3, 8}}), omni::Error);  // h not a multiple of merge
}

// bfloat16 weights (converted at load): the same computation, looser agreement.
TEST(Encoders, Bfloat16StaysCloseToTheFloat32Reference) {
  const auto& ref = fixture().reference;
  at::NoGradGuard no_grad;
  auto audio = load_audio(at::kBFloat16)->forward(ref.tensor("input_features"), {320});
  EXPECT_EQ(audio.scalar_type(), at::kBFloat16);
  const double audio_diff = max_abs_diff(audio, ref.tensor("audio_tower_output"));
  auto vision = load_vision(at::kBFloat16)->forward(ref.tensor("pixel_values"), reference_grid());
  EXPECT_EQ(vision.embeds.scalar_type(), at::kBFloat16);
  const double vision_diff = max_abs_diff(vision.embeds, ref.tensor("visual_output"));
  report("audio_tower_output_bf16", audio_diff);
  report("visual_output_bf16", vision_diff);
  EXPECT_LE(audio_diff, 0.1);
  EXPECT_LE(vision_diff, 0.1);
}

// Both encoders and their layers run through their hooks (the offload engine's entry points).
class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++pre; }
  void post_forward(torch::nn::Module&, const std::string&, c10::IValue&) override { ++post; }
  int pre = 0, post = 0;
};

TEST(Encoders, ForwardRunsThroughHooks) {
  const auto& ref = fixture().reference;
  auto audio = load_audio();
  auto vision = load_vision();
  auto audio_hook = std::make_shared<CountingHook>();
  auto layer_hook = std::make_shared<CountingHook>();
  auto vision_hook = std::make_shared<CountingHook>();
  auto block_hook = std::make_shared<CountingHook>();
  audio->hooks().attach("forward", "count", audio_hook);
  offload::find_hookable(*audio, "layers.1").hooks().attach("forward", "count", layer_hook);
  vision->hooks().attach("forward", "count", vision_hook);
  offload::find_hookable(*vision, "blocks.3").hooks().attach("forward", "count", block_hook);
  at::NoGradGuard no_grad;
  auto a = audio->forward(ref.tensor("input_features"), {320});
  auto v = vision->forward(ref.tensor("pixel_values"), reference_grid());
  EXPECT_EQ(audio_hook->pre, 1);
  EXPECT_EQ(audio_hook->post, 1);
  EXPECT_EQ(layer_hook->pre, 1);
  EXPECT_EQ(vision_hook->pre, 1);
  EXPECT_EQ(vision_hook->post, 1);
  EXPECT_EQ(block_hook->post, 1);
  // Hooks that do nothing change nothing.
  EXPECT_EQ(max_abs_diff(a, ref.tensor("audio_tower_output")) <= kTolerance, true);
  EXPECT_EQ(max_abs_diff(v.embeds, ref.tensor("visual_output")) <= kTolerance, true);
}

}  // namespace
}  // namespace omni::models::qwen3_omni
