// The Qwen3-Omni thinker against the Hugging Face reference (transformers 5.23.0, fp32) on the
// tiny random checkpoint of tests/fixtures/qwen3_omni_tiny (make_qwen3_omni_fixture.py):
// prompt building, multimodal positions, logits within 1e-4, greedy tokens equal.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu_offload/transfer_engine.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

const SafetensorsFile& reference() {
  static const SafetensorsFile file = SafetensorsFile::open(kDir + "/reference.safetensors");
  return file;
}

std::vector<int64_t> ids_of(const std::string& name) {
  auto t = reference().tensor(name).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// The multimodal prompt exactly as the reference saw it (features from HF's extractors).
qwen3_omni::ThinkerInputs reference_inputs() {
  qwen3_omni::ThinkerInputs in;
  in.input_ids = ids_of("mm_input_ids");
  in.audio_features = reference().tensor("input_features");
  in.audio_lengths = {in.audio_features.size(1)};
  in.pixel_values = reference().tensor("pixel_values");
  auto grid = reference().tensor("image_grid_thw").contiguous();
  in.image_grids = {
      {grid[0][0].item<int64_t>(), grid[0][1].item<int64_t>(), grid[0][2].item<int64_t>()}};
  return in;
}

std::unique_ptr<ThinkerRunner> load_runner(const ThinkerOffloadOptions& offload = {}) {
  ThinkerRunnerOptions options;
  options.model_dir = kDir;
  options.offload = offload;
  return ThinkerRunner::load(options, offload::make_cpu_sim_engine({}));
}

SamplingParams greedy(int64_t max_new_tokens) {
  SamplingParams p;
  p.greedy = true;
  p.max_new_tokens = max_new_tokens;
  return p;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(Qwen3OmniThinker, ConfigMatchesTheCheckpoint) {
  const auto cfg = qwen3_omni::parse_thinker_config(HfConfig::load(kDir));
  EXPECT_EQ(cfg.weight_prefix, "thinker.");
  EXPECT_EQ(cfg.text.num_hidden_layers, 3);
  EXPECT_EQ(cfg.text.head_dim, 16);
  EXPECT_EQ(cfg.text.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_TRUE(cfg.text.is_sparse_layer(0));
  EXPECT_FALSE(cfg.text.is_sparse_layer(1));  // mlp_only_layers = [1]
  EXPECT_EQ(cfg.vision.deepstack_visual_indexes, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(cfg.audio.n_window_infer, 200);
  EXPECT_EQ(cfg.image_token_id, 804);
  EXPECT_EQ(cfg.audio_token_id, 805);
}

TEST(Qwen3OmniThinker, MultimodalPositionsMatchTheReference) {
  const auto cfg = qwen3_omni::parse_thinker_config(HfConfig::load(kDir));
  const auto in = reference_inputs();
  const auto rope = qwen3_omni::rope_positions(cfg, in.input_ids, in.image_grids);
  EXPECT_TRUE(at::equal(rope.position_ids, reference().tensor("mm_position_ids")));
  // The image's 2 x 3 merged grid compresses 6 tokens into 3 positions: the delta is negative.
  EXPECT_EQ(rope.rope_delta, rope.position_ids.max().item<int64_t>() + 1 -
                                 static_cast<int64_t>(in.input_ids.size()));
  EXPECT_LT(rope.rope_delta, 0);
}

TEST(Qwen3OmniThinker, PromptFromFilesEqualsTheReferencePrompt) {
  auto runner = load_runner();
  ChatRequest request;
  request.text = "What do you hear and see?";
  request.audio_files = {kDir + "/audio.wav"};
  request.image_files = {kDir + "/image.png"};
  const auto in = runner->prepare(request);
  EXPECT_EQ(in.input_ids, ids_of("mm_input_ids"));
  EXPECT_LE(max_abs_diff(in.audio_features, reference().tensor("input_features")), 1e-4);
  EXPECT_LE(max_abs_diff(in.pixel_values, reference().tensor("pixel_values")), 1e-6);
}

TEST(Qwen3OmniThinker, LogitsMatchTheReference) {
  auto runner = load_runner();
  const auto logits = runner->prompt_logits(reference_inputs());
  const auto expected = reference().tensor("mm_logits");
  ASSERT_EQ(logits.sizes(), expected.sizes());
  const double diff = max_abs_diff(logits, expected);
  RecordProperty("max_abs_diff", std::to_string(diff));
  std::cout << "thinker logits max abs diff vs HF: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
}

TEST(Qwen3OmniThinker, GreedyMultimodalGenerationEqualsHfGenerate) {
  auto runner = load_runner();
  const auto expected = ids_of("mm_generated");
  ASSERT_GE(expected.size(), 32u);
  std::vector<int64_t> streamed;
  const auto result = runner->generate(
      reference_inputs(), greedy(static_cast<int64_t>(expected.size())), [&](int64_t token) {
        streamed.push_back(token);
        return true;
      });
  EXPECT_EQ(result.tokens, expected);
  EXPECT_EQ(streamed, result.tokens);
}

TEST(Qwen3OmniThinker, GreedyTextGenerationEqualsHfGenerate) {
  auto runner = load_runner();
  qwen3_omni::ThinkerInputs in;
  in.input_ids = ids_of("text_input_ids");
  const auto expected = ids_of("text_generated");
  ASSERT_GE(expected.size(), 32u);
  EXPECT_EQ(runner->generate(in, greedy(static_cast<int64_t>(expected.size()))).tokens, expected);
}

TEST(Qwen3OmniThinker, TextPromptFromTheChatTemplateEqualsTheReference) {
  auto runner = load_runner();
  ChatRequest request;
  request.text = "The quick brown fox jumps over the lazy dog. Hello, world!";
  EXPECT_EQ(runner->prepare(request).input_ids, ids_of("text_input_ids"));
}

TEST(Qwen3OmniThinker, SeededSamplingIsReproducibleAndStopTokensEndTheRun) {
  auto runner = load_runner();
  const auto in = reference_inputs();
  SamplingParams p;
  p.temperature = 1.5;
  p.top_k = 50;
  p.top_p = 0.95;
  p.max_new_tokens = 24;
  p.stop_token_ids = {-1};
  p.seed = 7;
  const auto a = runner->generate(in, p).tokens;
  EXPECT_EQ(runner->generate(in, p).tokens, a);
  p.seed = 8;
  EXPECT_NE(runner->generate(in, p).tokens, a);
  // A stop token ends generation right after it appears (and is part of the output).
  const auto expected = ids_of("mm_generated");
  SamplingParams g = greedy(40);
  g.stop_token_ids = {expected[5]};
  const auto stopped = runner->generate(in, g);
  const auto first = std::find(expected.begin(), expected.end(), expected[5]);
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(expected.begin(), first + 1));
  EXPECT_EQ(stopped.finish_reason, "stop");
}

TEST(Qwen3OmniThinker, WeightsAreBoundToTheFileMappingWithoutACopy) {
  const auto cfg = qwen3_omni::parse_thinker_config(HfConfig::load(kDir));
  const auto checkpoint = SafetensorsCheckpoint::open(kDir);
  qwen3_omni::Thinker thinker(cfg, at::kFloat);
  const auto report = load_weights(thinker, checkpoint, "thinker.");
  EXPECT_EQ(report.tensors, 200);
  EXPECT_EQ(report.converted, 0);
  for (const auto& p : thinker.named_parameters()) {
    EXPECT_EQ(static_cast<const void*>(p.value().data_ptr()),
              static_cast<const void*>(checkpoint.data("thinker." + p.key())))
        << p.key();
  }
}

}  // namespace
}  // namespace omni::models
