// `vllm-omni generate` end to end on the tiny Qwen3-Omni checkpoint, against the Hugging Face
// reference of tests/fixtures/qwen3_omni_tiny (make_qwen3_omni_fixture.py, speech_reference:
// greedy, thinker max 16 tokens, max 24 frames): the thinker's tokens, the codec codes, and the
// WAV libsndfile reads back; offload changes nothing, not a byte of the WAV.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sndfile.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_runner/output/wav_writer.h"
#include "model_runner/tokenizer/tokenizer.h"
#include "model_runner/weights/safetensors.h"
#include "process.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kFixture = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

const models::SafetensorsFile& reference() {
  static const models::SafetensorsFile file =
      models::SafetensorsFile::open(kFixture + "/reference.safetensors");
  return file;
}

std::vector<int64_t> ids_of(const std::string& name) {
  const at::Tensor t = reference().tensor(name).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// The reference codes [16, frames] as the JSON writes them: a list of frames of 16 codes.
Json reference_codes(const std::string& prompt) {
  const at::Tensor codes = reference().tensor(prompt + "_codes").t().contiguous();
  Json frames = Json::array();
  for (int64_t f = 0; f < codes.size(0); ++f) {
    const int64_t* p = codes[f].data_ptr<int64_t>();
    frames.push_back(std::vector<int64_t>(p, p + codes.size(1)));
  }
  return frames;
}

std::string reference_text(const std::string& prompt) {
  const auto tokens = ids_of(prompt + "_thinker_tokens");
  return models::Tokenizer::load(kFixture).decode(
      std::vector<int32_t>(tokens.begin(), tokens.end()), /*skip_special=*/true);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The three prompts of the reference, as command-line arguments.
std::vector<std::string> prompt_args(const std::string& prompt) {
  if (prompt == "speech_text") {
    return {"--system", "You are a helpful voice.", "--prompt", "Say something nice."};
  }
  if (prompt == "speech_audio") {
    return {"--audio", kFixture + "/audio.wav", "--prompt", "What do you hear?"};
  }
  return {"--image", kFixture + "/image.png", "--prompt", "What do you see?"};
}

class GenerateE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("vllm_omni_e2e_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `generate` with the reference's settings; returns the JSON on stdout (and fails the
  // test unless the run succeeds and stdout is exactly one JSON object).
  Json generate(const std::string& prompt, const std::vector<std::string>& extra,
                process::ProcessResult* raw = nullptr) {
    std::vector<std::string> args = {OMNI_VLLM_OMNI, "generate", "--model", kFixture};
    for (const auto& a : prompt_args(prompt)) args.push_back(a);
    for (const auto& a : {"--max-tokens", "16", "--max-audio-frames", "24", "--greedy", "--json"}) {
      args.push_back(a);
    }
    args.insert(args.end(), extra.begin(), extra.end());
    const process::ProcessResult r = process::run_process(args);
    if (raw) *raw = r;
    EXPECT_EQ(r.status, 0) << r.err;
    if (r.status != 0) return Json();
    EXPECT_EQ(process::count_lines(r.out), 1u) << r.out;
    return Json::parse(r.out);  // throws (fails the test) on anything but one JSON value
  }

 private:
  fs::path dir_;
};

TEST_F(GenerateE2E, TextPromptGivesTheReferenceTokensCodesAndWav) {
  const std::string wav = path("out.wav");
  const Json j = generate("speech_text", {"--output-wav", wav});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["token_ids"].get<std::vector<int64_t>>(), ids_of("speech_text_thinker_tokens"));
  EXPECT_EQ(j["text"], reference_text("speech_text"));
  EXPECT_EQ(j["codes"], reference_codes("speech_text"));
  EXPECT_EQ(j["wav"], wav);
  EXPECT_EQ(j["sample_rate"], 24000);
  EXPECT_EQ(j["speaker"], "ethan");
  EXPECT_TRUE(j["finish_reason"].is_string());
  for (const char* key : {"load_ms", "thinker_prefill_ms", "thinker_decode_tokens_per_s",
                          "talker_ms", "talker_frames_per_s", "code_predictor_ms", "code2wav_ms",
                          "code2wav_real_time_factor", "time_to_first_audio_ms", "total_ms"}) {
    EXPECT_TRUE(j["timings"].contains(key)) << key;
  }
  // One object per stage, as `serve` and the stage workers report them.
  for (const char* stage : {"stage 0 (thinker)", "stage 1 (talker)", "stage 2 (code2wav)"}) {
    EXPECT_EQ(j["offload"][stage]["strategy"], "none") << stage;
  }
  EXPECT_GT(j["timings"]["load_ms"].get<double>(), 0.0);

  const at::Tensor expected = reference().tensor("speech_text_wav");
  const models::WavContents read = models::read_wav(wav, at::kShort);
  EXPECT_EQ(read.format, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
  EXPECT_EQ(read.sample_rate, 24000);
  EXPECT_EQ(read.channels, 1);
  ASSERT_EQ(read.frames, expected.numel());
  EXPECT_DOUBLE_EQ(j["audio_seconds"].get<double>(), expected.numel() / 24000.0);
  // PCM16 of a waveform within 1e-4 of the reference: within 1e-4 * 32767 + rounding.
  const at::Tensor pcm = read.samples.reshape({-1}).to(at::kDouble);
  const double lsb =
      (pcm - expected.to(at::kDouble).clamp(-1, 1) * 32767).abs().max().item<double>();
  EXPECT_LE(lsb, 1e-4 * 32767 + 0.5);
}

TEST_F(GenerateE2E, Float32WavIsTheReferenceWaveform) {
  const std::string wav = path("out.wav");
  generate("speech_text", {"--output-wav", wav, "--wav-format", "f32"});
  const models::WavContents read = models::read_wav(wav, at::kFloat);
  EXPECT_EQ(read.format, SF_FORMAT_WAV | SF_FORMAT_FLOAT);
  const at::Tensor expected = reference().tensor("speech_text_wav");
  ASSERT_EQ(read.frames, expected.numel());
  EXPECT_LE((read.samples.reshape({-1}) - expected).abs().max().item<double>(), 1e-4);
}

// Component offload of the talker and code2wav, of every part of the thinker, layerwise
// streaming and whole stages taking turns on the device: the same text, codes and WAV bytes as
// without offload.
TEST_F(GenerateE2E, OffloadChangesNothing) {
  const Json baseline = generate("speech_text", {"--output-wav", path("none.wav")});
  ASSERT_FALSE(baseline.is_null());
  const std::string baseline_wav = read_file(path("none.wav"));
  ASSERT_FALSE(baseline_wav.empty());
  const std::vector<std::vector<std::string>> modes = {
      {"--cpu-offload-components", "talker,code2wav"},
      {"--cpu-offload-components", "thinker.*"},
      {"--enable-layerwise-offload"},
      {"--enable-cpu-offload"}};
  // The strategy each mode gives the thinker, talker and code2wav stages.
  const std::vector<std::vector<std::string>> strategies = {
      {"none", "component", "component"},
      {"component", "none", "none"},
      {"layerwise", "layerwise", "none"},
      {"component", "component", "component"}};
  const char* stages[] = {"stage 0 (thinker)", "stage 1 (talker)", "stage 2 (code2wav)"};
  for (size_t i = 0; i < modes.size(); ++i) {
    const std::string wav = path("mode" + std::to_string(i) + ".wav");
    std::vector<std::string> extra = modes[i];
    extra.push_back("--output-wav");
    extra.push_back(wav);
    const Json j = generate("speech_text", extra);
    ASSERT_FALSE(j.is_null()) << modes[i][0];
    EXPECT_EQ(j["text"], baseline["text"]) << modes[i][0];
    EXPECT_EQ(j["token_ids"], baseline["token_ids"]) << modes[i][0];
    EXPECT_EQ(j["codes"], baseline["codes"]) << modes[i][0];
    EXPECT_TRUE(read_file(wav) == baseline_wav) << modes[i][0] << " " << modes[i].back();
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(j["offload"][stages[s]]["strategy"], strategies[i][s]) << modes[i][0] << stages[s];
    }
  }
}

TEST_F(GenerateE2E, TextOnlyWritesNoWavAndStreamsTheSameText) {
  const std::string wav = path("out.wav");
  process::ProcessResult raw;
  const Json j = generate("speech_text", {"--modalities", "text", "--output-wav", wav}, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["text"], reference_text("speech_text"));
  EXPECT_EQ(j["token_ids"].get<std::vector<int64_t>>(), ids_of("speech_text_thinker_tokens"));
  EXPECT_TRUE(j["wav"].is_null());
  EXPECT_TRUE(j["speaker"].is_null());
  EXPECT_EQ(j["codes"], Json::array());
  EXPECT_FALSE(fs::exists(wav));
  EXPECT_NE(raw.err.find("is not written"), std::string::npos) << raw.err;

  // Without --json the text streams to stdout, then a newline, and nothing else.
  std::vector<std::string> args = {OMNI_VLLM_OMNI, "generate", "--model", kFixture};
  for (const auto& a : prompt_args("speech_text")) args.push_back(a);
  for (const auto& a : {"--max-tokens", "16", "--greedy", "--modalities", "text"}) {
    args.push_back(a);
  }
  const auto streamed = process::run_process(args);
  EXPECT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_EQ(streamed.out, reference_text("speech_text") + "\n");
}

TEST_F(GenerateE2E, AudioPromptGivesTheReferenceCodes) {
  const Json j = generate("speech_audio", {});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["token_ids"].get<std::vector<int64_t>>(), ids_of("speech_audio_thinker_tokens"));
  EXPECT_EQ(j["codes"], reference_codes("speech_audio"));
  EXPECT_TRUE(j["wav"].is_null());  // no --output-wav
  EXPECT_DOUBLE_EQ(j["audio_seconds"].get<double>(),
                   reference().tensor("speech_audio_wav").numel() / 24000.0);
}

TEST_F(GenerateE2E, ImagePromptGivesTheReferenceCodes) {
  const Json j = generate("speech_image", {});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["token_ids"].get<std::vector<int64_t>>(), ids_of("speech_image_thinker_tokens"));
  EXPECT_EQ(j["codes"], reference_codes("speech_image"));
}

}  // namespace
}  // namespace omni::cli
