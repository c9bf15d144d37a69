// Speech output of Qwen3-Omni against the Hugging Face reference (transformers 5.23.0, fp32) on
// the tiny checkpoint of tests/fixtures/qwen3_omni_tiny (make_qwen3_omni_fixture.py): the
// thinker's hidden states, the thinker -> talker hand-off, talker and code predictor logits
// within 1e-4, greedy codes equal to generate(return_audio=True, thinker_do_sample=False,
// talker_do_sample=False) on text, audio and image prompts. (The whole model from a user's
// request, with the waveform, runs through the stage pipeline: tests/worker/pipeline_parity_test.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/speech_runners.h"
#include "model_runner/runner/thinker_runner.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

using qwen3_omni::Talker;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

const SafetensorsFile& reference() {
  static const SafetensorsFile file = SafetensorsFile::open(kDir + "/reference.safetensors");
  return file;
}

at::Tensor expected(const std::string& name) { return reference().tensor(name).contiguous(); }

std::vector<int64_t> ids_of(const std::string& name) {
  auto t = expected(name);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

ThinkerRunner& thinker_runner() {
  static auto r = [] {
    ThinkerRunnerOptions options;
    options.model_dir = kDir;
    return ThinkerRunner::load(options, offload::make_cpu_sim_engine({}));
  }();
  return *r;
}

TalkerRunner& talker_runner() {
  static auto r = [] {
    SpeechRunnerOptions options;
    options.model_dir = kDir;
    return TalkerRunner::load(options, offload::make_cpu_sim_engine({}));
  }();
  return *r;
}

TEST(Qwen3OmniSpeech, ConfigOfTheTalker) {
  const auto config = HfConfig::load(kDir);
  const auto thinker = qwen3_omni::parse_thinker_config(config);
  ASSERT_TRUE(qwen3_omni::has_speech_output(config));
  const auto t = qwen3_omni::parse_talker_config(config, thinker);
  EXPECT_EQ(t.text.num_experts, 4);  // num_local_experts in the file
  EXPECT_EQ(t.text.shared_expert_intermediate_size, 24);
  EXPECT_TRUE(t.text.is_sparse_layer(0));
  EXPECT_TRUE(t.text.is_sparse_layer(1));
  EXPECT_EQ(t.accept_hidden_layer, 2);
  EXPECT_EQ(t.code_predictor.num_code_groups, 16);
  EXPECT_EQ(t.code_predictor.head_dim, 8);
  ASSERT_EQ(t.speakers.size(), 3u);
  EXPECT_EQ(qwen3_omni::speaker_codec_id(t, "Ethan"), 382);
  EXPECT_EQ(qwen3_omni::speaker_codec_id(t, "CHELSIE"), 381);
  try {
    qwen3_omni::speaker_codec_id(t, "bob");
    FAIL() << "an unknown speaker must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bob"), std::string::npos) << m;
    EXPECT_NE(m.find("aiden, chelsie, ethan"), std::string::npos) << m;
  }
  const auto suppressed = qwen3_omni::talker_suppressed_tokens(t);
  EXPECT_EQ(suppressed.size(), 1023u);  // ids 128..1151 but codec EOS
  EXPECT_EQ(suppressed.front(), 128);
  EXPECT_EQ(std::count(suppressed.begin(), suppressed.end(), t.codec_eos_token_id), 0);
}

// The thinker with capture, the hand-off and the projections against what the reference's
// talker.generate received (text prompt with a system turn the talker must not see).
TEST(Qwen3OmniSpeech, HandoffMatchesTheReference) {
  auto& thinker = thinker_runner().model();
  const auto cfg = qwen3_omni::parse_talker_config(
      HfConfig::load(kDir), qwen3_omni::parse_thinker_config(HfConfig::load(kDir)));
  qwen3_omni::ThinkerInputs inputs;
  inputs.input_ids = ids_of("speech_text_input_ids");
  at::NoGradGuard no_grad;
  auto state = thinker.new_state(cfg.accept_hidden_layer);
  auto logits = thinker.prefill(inputs, state)[0];
  const auto tokens = ids_of("speech_text_thinker_tokens");
  SamplingParams p;
  p.greedy = true;
  p.repetition_penalty = 1.05;
  Sampler sampler(p);
  std::vector<int64_t> context = inputs.input_ids, generated;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t token = sampler.sample(logits, context);
    ASSERT_EQ(token, tokens[i]) << "thinker token " << i;
    generated.push_back(token);
    context.push_back(token);
    if (i + 1 < tokens.size()) logits = thinker.decode(token, state);
  }
  const auto hidden = at::cat(state.hidden, 0);
  EXPECT_LE(max_abs_diff(hidden, expected("speech_text_thinker_hidden")), 1e-4);

  qwen3_omni::ThinkerHandoff handoff;
  handoff.prompt_ids = inputs.input_ids;
  handoff.generated = generated;
  handoff.embeds = at::cat(state.embeds, 0);
  handoff.hidden = hidden;
  handoff.tts_embeds = thinker.embed({812, 813, 811});  // tts bos, eos, pad
  qwen3_omni::HandoffIds ids;
  ids.im_start = 1;
  ids.user = 339;
  ids.assistant = 327;
  ids.tts_pad = 811;
  ids.multimodal = {805, 804, 806};
  ids.thinker_eos = {2, 0};
  ids.codec_prefix = {cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id, 382,
                      cfg.codec_pad_id,     cfg.codec_bos_id};
  const auto prompt = qwen3_omni::build_talker_prompt(handoff, ids);
  EXPECT_EQ(prompt.input_ids, ids_of("speech_text_talker_input_ids"));
  const auto projected = talker_runner().model().project(prompt);
  EXPECT_LE(max_abs_diff(projected.embeds, expected("speech_text_talker_input_embeds")), 1e-5);
  EXPECT_LE(max_abs_diff(projected.trailing, expected("speech_text_trailing_text")), 1e-5);
  EXPECT_LE(max_abs_diff(projected.tts_pad, expected("tts_pad_embed")), 1e-5);
}

// The talker and the code predictor fed exactly the reference's prefill: logits per step within
// 1e-4 and the greedy frames equal, for every prompt.
class Qwen3OmniTalkerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen3OmniTalkerParity, LogitsAndCodesMatchTheReference) {
  const std::string name = GetParam();
  auto& talker = talker_runner().model();
  const auto& cfg = talker.config();
  at::NoGradGuard no_grad;
  Talker::ProjectedPrompt prompt;
  prompt.embeds = expected(name + "_talker_input_embeds");
  prompt.trailing = expected(name + "_trailing_text");
  prompt.tts_pad = expected("tts_pad_embed");
  std::vector<std::array<int64_t, 3>> grids;
  if (name == "speech_image") {
    auto g = expected("image_grid_thw");
    grids = {{g[0][0].item<int64_t>(), g[0][1].item<int64_t>(), g[0][2].item<int64_t>()}};
  }
  auto state = talker.new_state();
  at::Tensor logits =
      talker.prefill_embeds(prompt, ids_of(name + "_talker_input_ids"), grids, state);
  const auto ref_logits = expected(name + "_talker_logits");
  const auto codes = expected(name + "_codes");
  const auto ref_cp = expected(name + "_cp_logits");
  SamplingParams cp_params;
  cp_params.greedy = true;
  Sampler cp_sampler(cp_params);
  double worst_talker = 0, worst_cp = 0;
  for (int64_t t = 0; t < codes.size(1); ++t) {
    worst_talker = std::max(worst_talker, max_abs_diff(logits, ref_logits[t]));
    std::vector<at::Tensor> cp_logits;
    const auto frame = talker.step(codes[0][t].item<int64_t>(), state, cp_sampler, logits,
                                   t < 2 ? &cp_logits : nullptr);
    for (int64_t q = 0; q < cfg.num_code_groups; ++q) {
      ASSERT_EQ(frame[q], codes[q][t].item<int64_t>()) << "frame " << t << " group " << q;
    }
    for (size_t k = 0; k < cp_logits.size(); ++k) {
      worst_cp = std::max(worst_cp, max_abs_diff(cp_logits[k], ref_cp[t][k]));
    }
  }
  worst_talker = std::max(worst_talker, max_abs_diff(logits, ref_logits[codes.size(1)]));
  EXPECT_LE(worst_talker, 1e-4);
  EXPECT_LE(worst_cp, 1e-4);
  std::cout << name << ": talker logits max abs diff " << worst_talker << ", code predictor "
            << worst_cp << "\n";
}

INSTANTIATE_TEST_SUITE_P(Prompts, Qwen3OmniTalkerParity,
                         ::testing::Values("speech_text", "speech_audio", "speech_image"));

TEST(Qwen3OmniSpeech, HandoffNeedsTwoTokensAndAnAssistantTurn) {
  qwen3_omni::ThinkerHandoff h;
  h.prompt_ids = {1, 339, 5, 2, 1, 327, 9};
  h.generated = {7};
  h.embeds = at::zeros({7, 4});
  h.hidden = at::zeros({7, 4});
  h.tts_embeds = at::zeros({3, 4});
  qwen3_omni::HandoffIds ids;
  ids.im_start = 1;
  ids.user = 339;
  ids.assistant = 327;
  ids.codec_prefix = {1, 2, 3, 4, 5, 6};
  EXPECT_THROW(qwen3_omni::build_talker_prompt(h, ids), Error);  // one generated token
  h.generated = {7, 8};
  h.embeds = at::arange(32, at::kFloat).view({8, 4});
  h.hidden = h.embeds + 1000;
  auto prompt = qwen3_omni::build_talker_prompt(h, ids);
  // User turn: positions 0..3; assistant part: 9 rows; trailing: row 7 (generated token 1's
  // embedding... here the 5th row after the assistant start), then tts_eos.
  EXPECT_EQ(prompt.input_ids.size(), 4u + 9u);
  h.prompt_ids = {1, 339, 5, 2, 1, 339, 9};  // no assistant turn
  EXPECT_THROW(qwen3_omni::build_talker_prompt(h, ids), Error);
}

}  // namespace
}  // namespace omni::models
