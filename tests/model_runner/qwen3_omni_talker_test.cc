// Speech output of Qwen3-Omni against the Hugging Face reference (transformers 5.23.0, fp32) on
// the tiny checkpoint of tests/fixtures/qwen3_omni_tiny (make_qwen3_omni_fixture.py): the
// thinker's hidden states, the thinker -> talker hand-off, talker and code predictor logits
// within 1e-4, greedy codes equal to generate(return_audio=True, thinker_do_sample=False,
// talker_do_sample=False) on text, audio and image prompts, and the waveform within 1e-4.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/qwen3_omni/omni_model.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/omni_runner.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

using qwen3_omni::Talker;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
// The requests of the reference's speech runs (make_qwen3_omni_fixture.py).
constexpr int64_t kThinkerTokens = 16;
constexpr int64_t kAudioFrames = 24;

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

OmniRunner& runner() {
  static auto r = [] {
    OmniRunnerOptions options;
    options.model_dir = kDir;
    return OmniRunner::load(options, offload::make_cpu_sim_engine({}));
  }();
  return *r;
}

// The three speech prompts of the fixture, as a user writes them.
OmniRequest request(const std::string& name) {
  OmniRequest r;
  if (name == "speech_text") {
    r.chat.system_prompt = "You are a helpful voice.";
    r.chat.text = "Say something nice.";
  } else if (name == "speech_audio") {
    r.chat.text = "What do you hear?";
    r.chat.audio_files = {kDir + "/audio.wav"};
  } else {
    r.chat.text = "What do you see?";
    r.chat.image_files = {kDir + "/image.png"};
  }
  r.sampling.set_greedy(true);
  r.sampling.thinker.max_new_tokens = kThinkerTokens;
  r.max_audio_frames = kAudioFrames;
  return r;
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
  auto& model = runner().model();
  auto& thinker = model.thinker();
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
  const auto projected = model.talker().project(prompt);
  EXPECT_LE(max_abs_diff(projected.embeds, expected("speech_text_talker_input_embeds")), 1e-5);
  EXPECT_LE(max_abs_diff(projected.trailing, expected("speech_text_trailing_text")), 1e-5);
  EXPECT_LE(max_abs_diff(projected.tts_pad, expected("tts_pad_embed")), 1e-5);
}

// The talker and the code predictor fed exactly the reference's prefill: logits per step within
// 1e-4 and the greedy frames equal, for every prompt.
class Qwen3OmniTalkerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen3OmniTalkerParity, LogitsAndCodesMatchTheReference) {
  const std::string name = GetParam();
  auto& talker = runner().model().talker();
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

// The whole model from the user's request: thinker tokens, codes and waveform as
// Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True) made them.
TEST_P(Qwen3OmniTalkerParity, GenerateMatchesTheReference) {
  const std::string name = GetParam();
  std::vector<int64_t> streamed_frames;
  int64_t audio_chunks = 0;
  OmniCallbacks callbacks;
  callbacks.on_frame = [&](const std::vector<int64_t>& frame) {
    streamed_frames.push_back(frame[0]);
    return true;
  };
  callbacks.on_audio = [&](const at::Tensor&) {
    ++audio_chunks;
    return true;
  };
  const auto result = runner().generate(request(name), callbacks);
  EXPECT_EQ(result.tokens, ids_of(name + "_thinker_tokens"));
  const auto codes = expected(name + "_codes");
  ASSERT_EQ(result.codes.sizes(), codes.sizes());
  EXPECT_TRUE(at::equal(result.codes, codes));
  EXPECT_EQ(result.audio_finish_reason, "length");
  EXPECT_EQ(static_cast<int64_t>(streamed_frames.size()), codes.size(1));
  EXPECT_GE(audio_chunks, 2);  // 4 frames first, then the rest
  const auto wav = expected(name + "_wav");
  ASSERT_EQ(result.waveform.numel(), wav.numel());  // 24 * 1920 - 555 samples
  const double diff = max_abs_diff(result.waveform, wav);
  EXPECT_LE(diff, 1e-4);
  std::cout << name << ": waveform max abs diff " << diff << "\n";
  EXPECT_GT(result.timings.time_to_first_audio_ms, 0);
  EXPECT_GT(result.timings.talker_frames_per_s, 0);
}

INSTANTIATE_TEST_SUITE_P(Prompts, Qwen3OmniTalkerParity,
                         ::testing::Values("speech_text", "speech_audio", "speech_image"));

TEST(Qwen3OmniSpeech, TextOnlyRequestSkipsTheTalker) {
  auto r = request("speech_text");
  r.audio_output = false;
  const auto result = runner().generate(r);
  EXPECT_EQ(result.tokens, ids_of("speech_text_thinker_tokens"));
  EXPECT_FALSE(result.codes.defined() && result.codes.numel() > 0);
  EXPECT_EQ(result.audio_finish_reason, "none");
}

TEST(Qwen3OmniSpeech, FrameCapAndCancellation) {
  auto r = request("speech_text");
  r.max_audio_frames = 5;
  auto result = runner().generate(r);
  ASSERT_EQ(result.codes.size(1), 5);
  EXPECT_TRUE(at::equal(result.codes, expected("speech_text_codes").narrow(1, 0, 5)));
  EXPECT_EQ(result.waveform.numel(), 5 * 1920 - 555);

  OmniCallbacks stop_after_3;
  int frames = 0;
  stop_after_3.on_frame = [&](const std::vector<int64_t>&) { return ++frames < 3; };
  result = runner().generate(request("speech_text"), stop_after_3);
  EXPECT_EQ(result.audio_finish_reason, "cancelled");
  EXPECT_EQ(result.codes.size(1), 3);
}

// Sampling (the reference defaults of every stage): a seed reproduces text, codes and waveform;
// another seed gives other codes. (Hugging Face draws from another generator, so sampled runs
// are compared with themselves, not with the reference.)
TEST(Qwen3OmniSpeech, SampledRunsAreReproducibleFromTheSeed) {
  auto r = request("speech_text");
  r.sampling = OmniSampling();
  r.sampling.thinker.max_new_tokens = kThinkerTokens;
  r.sampling.set_seed(7);
  const auto a = runner().generate(r);
  const auto b = runner().generate(r);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_GT(a.codes.size(1), 0);
  EXPECT_TRUE(at::equal(a.codes, b.codes));
  EXPECT_TRUE(at::equal(a.waveform, b.waveform));
  r.sampling.set_seed(8);
  const auto c = runner().generate(r);
  EXPECT_FALSE(c.codes.sizes() == a.codes.sizes() && at::equal(c.codes, a.codes));
  // Sampled talker codes are not the greedy ones.
  const auto greedy = expected("speech_text_codes");
  EXPECT_FALSE(a.codes.sizes() == greedy.sizes() && at::equal(a.codes, greedy));
}

TEST(Qwen3OmniSpeech, BadRequestsAreRefused) {
  auto r = request("speech_text");
  r.speaker = "nobody";
  try {
    runner().generate(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nobody"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("ethan"), std::string::npos);
  }
  r = request("speech_text");
  r.text_output = r.audio_output = false;
  EXPECT_THROW(runner().generate(r), Error);
  r = request("speech_text");
  r.stream.chunk_frames = 0;
  EXPECT_THROW(runner().generate(r), Error);
}

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
