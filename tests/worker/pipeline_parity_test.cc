// The whole Qwen3-Omni model from a user's request, through the stage pipeline exactly as
// `generate --model` and `serve --model` build it (the checkpoint's stages in this process),
// against the Hugging Face reference (transformers, fp32) on the tiny checkpoint of
// tests/fixtures/qwen3_omni_tiny: thinker tokens and codes equal to
// generate(return_audio=True, thinker_do_sample=False, talker_do_sample=False) on text, audio
// and image prompts, the waveform within 1e-4; text-only requests, the frame cap, cancellation,
// seeds and bad requests.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "model_runner/weights/safetensors.h"
#include "worker/pipeline/local_pipeline.h"

#include "tiny_request.h"

namespace omni::pipeline {
namespace {

using testing::omni;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
// The requests of the reference's speech runs (make_qwen3_omni_fixture.py).
constexpr int64_t kThinkerTokens = 16;
constexpr int64_t kAudioFrames = 24;

const models::SafetensorsFile& reference() {
  static const auto file = models::SafetensorsFile::open(kDir + "/reference.safetensors");
  return file;
}

at::Tensor expected(const std::string& name) { return reference().tensor(name).contiguous(); }

std::vector<int64_t> ids_of(const std::string& name) {
  const auto t = expected(name);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

Pipeline& pipeline() {
  static const std::unique_ptr<Pipeline> p =
      make_local_pipeline(checkpoint_stage_config(kDir, "cpu", "auto"), "cpu");
  return *p;
}

// The three speech prompts of the fixture, as a user writes them.
Request request(const std::string& name) {
  Request r;
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
  omni(r).sampling.set_greedy(true);
  omni(r).sampling.thinker.max_new_tokens = kThinkerTokens;
  omni(r).max_audio_frames = kAudioFrames;
  return r;
}

class PipelineParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineParity, TokensCodesAndWaveformAreTheReferences) {
  const std::string name = GetParam();
  std::vector<int64_t> streamed_frames;
  int64_t audio_chunks = 0;
  PipelineCallbacks callbacks;
  callbacks.on_frame = [&](const std::vector<int64_t>& frame) {
    streamed_frames.push_back(frame[0]);
    return true;
  };
  callbacks.on_audio = [&](const at::Tensor&) {
    ++audio_chunks;
    return true;
  };
  const auto got = pipeline().generate(request(name), callbacks);
  EXPECT_EQ(got.tokens, ids_of(name + "_thinker_tokens"));
  const auto codes = expected(name + "_codes");
  ASSERT_TRUE(got.audio.codes.defined());
  ASSERT_EQ(got.audio.codes.sizes(), codes.sizes());
  EXPECT_TRUE(at::equal(got.audio.codes, codes));
  EXPECT_EQ(got.audio.finish_reason, "length");
  EXPECT_EQ(static_cast<int64_t>(streamed_frames.size()), codes.size(1));
  EXPECT_GE(audio_chunks, 2);  // 4 frames first, then the rest
  const auto wav = expected(name + "_wav");
  ASSERT_EQ(got.audio.waveform.numel(), wav.numel());  // 24 * 1920 - 555 samples
  const double diff = max_abs_diff(got.audio.waveform, wav);
  EXPECT_LE(diff, 1e-4);
  std::cout << name << ": waveform max abs diff " << diff << "\n";
  EXPECT_GT(got.timings.at("time_to_first_audio_ms"), 0);
  EXPECT_GT(got.timings.at("talker_frames_per_s"), 0);
}

INSTANTIATE_TEST_SUITE_P(Prompts, PipelineParity,
                         ::testing::Values("speech_text", "speech_audio", "speech_image"));

TEST(PipelineRequests, TextOnlyRunsNoTalker) {
  auto r = request("speech_text");
  r.audio_output = false;
  const auto got = pipeline().generate(r);
  EXPECT_EQ(got.tokens, ids_of("speech_text_thinker_tokens"));
  EXPECT_FALSE(got.audio.codes.defined() && got.audio.codes.numel() > 0);
  EXPECT_EQ(got.stage_metrics.count("stage 1 (talker)"), 0u);
}

TEST(PipelineRequests, FrameCapAndCancellation) {
  auto r = request("speech_text");
  omni(r).max_audio_frames = 5;
  auto got = pipeline().generate(r);
  ASSERT_EQ(got.audio.codes.size(1), 5);
  EXPECT_TRUE(at::equal(got.audio.codes, expected("speech_text_codes").narrow(1, 0, 5)));
  EXPECT_EQ(got.audio.waveform.numel(), 5 * 1920 - 555);

  PipelineCallbacks stop_after_3;
  int frames = 0;
  stop_after_3.on_frame = [&](const std::vector<int64_t>&) { return ++frames < 3; };
  got = pipeline().generate(request("speech_text"), stop_after_3);
  EXPECT_EQ(frames, 3);
  EXPECT_EQ(got.audio.finish_reason, "cancelled");
}

// Sampling (the reference defaults of every stage): a seed reproduces text, codes and waveform;
// another seed gives other codes. (Hugging Face draws from another generator, so sampled runs
// are compared with themselves, not with the reference.)
TEST(PipelineRequests, SampledRunsAreReproducibleFromTheSeed) {
  auto r = request("speech_text");
  omni(r).sampling = models::OmniSampling();
  omni(r).sampling.thinker.max_new_tokens = kThinkerTokens;
  omni(r).sampling.set_seed(7);
  const auto a = pipeline().generate(r);
  const auto b = pipeline().generate(r);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_GT(a.audio.codes.size(1), 0);
  EXPECT_TRUE(at::equal(a.audio.codes, b.audio.codes));
  EXPECT_TRUE(at::equal(a.audio.waveform, b.audio.waveform));
  omni(r).sampling.set_seed(8);
  const auto c = pipeline().generate(r);
  EXPECT_FALSE(c.audio.codes.sizes() == a.audio.codes.sizes() &&
               at::equal(c.audio.codes, a.audio.codes));
  // Sampled talker codes are not the greedy ones.
  const auto greedy = expected("speech_text_codes");
  EXPECT_FALSE(a.audio.codes.sizes() == greedy.sizes() && at::equal(a.audio.codes, greedy));
}

TEST(PipelineRequests, BadRequestsAreRefusedAndThePipelineStillServes) {
  auto r = request("speech_text");
  r.voice = "nobody";
  try {
    pipeline().generate(r);
    FAIL() << "an unknown speaker must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("nobody"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ethan"), std::string::npos) << e.what();
  }
  r = request("speech_text");
  r.text_output = r.audio_output = false;
  EXPECT_ANY_THROW(pipeline().generate(r));
  r = request("speech_text");
  omni(r).stream.chunk_frames = 0;
  EXPECT_ANY_THROW(pipeline().generate(r));
  EXPECT_EQ(pipeline().generate(request("speech_text")).tokens,
            ids_of("speech_text_thinker_tokens"));
}

}  // namespace
}  // namespace omni::pipeline
