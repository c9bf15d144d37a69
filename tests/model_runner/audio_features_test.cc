// Audio inputs: decoding with libsndfile (mono mix-down, FLAC, from memory, errors that name
// the file), Whisper log-mel features against Hugging Face's WhisperFeatureExtractor output in
// tests/fixtures/qwen3_omni_tiny/reference.safetensors, and resampling with libsoxr against
// librosa.load(sr=16000) / python-soxr in tests/fixtures/audio_resample
// (make_audio_resample_fixture.py).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sndfile.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "model_runner/preprocess/audio.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;
using testing::peak_rss_growth;
using testing::write_bytes;

const std::string kFixtureDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";
const std::string kResampleDir = std::string(OMNI_FIXTURES_DIR) + "/audio_resample";

// Writes interleaved 16-bit PCM frames with libsndfile in `format` (SF_FORMAT_WAV, ...).
void write_pcm16(const std::string& path, const std::vector<int16_t>& interleaved, int channels,
                 int sample_rate, int format = SF_FORMAT_WAV) {
  SF_INFO info{};
  info.channels = channels;
  info.samplerate = sample_rate;
  info.format = format | SF_FORMAT_PCM_16;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  ASSERT_NE(f, nullptr) << path << ": " << sf_strerror(nullptr);
  const sf_count_t frames = static_cast<sf_count_t>(interleaved.size()) / channels;
  EXPECT_EQ(sf_writef_short(f, interleaved.data(), frames), frames);
  sf_close(f);
}

// A deterministic pseudo-random PCM16 sequence.
std::vector<int16_t> pcm_ramp(size_t n, uint32_t seed) {
  std::vector<int16_t> out(n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<int16_t>(static_cast<int32_t>(x >> 16) - 32768);
  }
  return out;
}

using AudioFileTest = testing::TempDirTest;

TEST(AudioFeatures, MatchesHuggingFaceWhisperFeatureExtractor) {
  const AudioClip clip = read_audio_file(kFixtureDir + "/audio.wav");
  EXPECT_EQ(clip.sample_rate, 16000);
  ASSERT_EQ(clip.samples.size(), 51200u);  // 3.2 s

  const WhisperFeatureOptions opt = whisper_options_from_preprocessor_config(kFixtureDir);
  const at::Tensor features = whisper_log_mel(clip, opt);
  const at::Tensor expected =
      SafetensorsFile::open(kFixtureDir + "/reference.safetensors").tensor("input_features");
  ASSERT_EQ(expected.sizes(), (std::vector<int64_t>{128, 320}));
  ASSERT_EQ(features.sizes(), expected.sizes());
  EXPECT_EQ(features.scalar_type(), at::kFloat);
  EXPECT_TRUE(features.is_contiguous());
  EXPECT_EQ(whisper_num_frames(static_cast<int64_t>(clip.samples.size()), opt), 320);

  const double max_diff = (features - expected).abs().max().item<double>();
  std::cout << "[ audio ] max |C++ - HF| of input_features: " << max_diff << "\n";
  ::testing::Test::RecordProperty("max_abs_diff", std::to_string(max_diff));
  EXPECT_LE(max_diff, 1e-4);
}

TEST(AudioFeatures, MelFilterBankIsSlaneyNormalised) {
  const at::Tensor bank = whisper_mel_filter_bank(WhisperFeatureOptions{});
  ASSERT_EQ(bank.sizes(), (std::vector<int64_t>{201, 128}));
  EXPECT_EQ(bank.scalar_type(), at::kFloat);
  EXPECT_GE(bank.min().item<float>(), 0.0f);
  // Every filter has some weight, and DC lies on no filter's slope but the first one's foot.
  EXPECT_GT(bank.amax(0).min().item<float>(), 0.0f);
  EXPECT_EQ(bank[0].sum().item<float>(), 0.0f);
}

TEST(AudioFeatures, FrameCountIsSamplesOverHop) {
  WhisperFeatureOptions opt;
  AudioClip clip;
  clip.sample_rate = 16000;
  const std::vector<int16_t> pcm = pcm_ramp(16000 + 77, 7);
  for (int16_t s : pcm) clip.samples.push_back(static_cast<float>(s) / 32768.0f);
  const at::Tensor features = whisper_log_mel(clip, opt);
  EXPECT_EQ(features.sizes(), (std::vector<int64_t>{128, 100}));
  // The floor at max - 8 and the affine map bound the values.
  const float max = features.max().item<float>();
  EXPECT_GE(features.min().item<float>(), max - 2.0f - 1e-6f);
}

TEST(AudioFeatures, WrongSampleRateIsRejected) {
  AudioClip clip;
  clip.sample_rate = 44100;
  clip.samples.assign(44100, 0.25f);
  const std::string err = error_of([&] { whisper_log_mel(clip, WhisperFeatureOptions{}); });
  EXPECT_CONTAINS(err, "44100 Hz");
  EXPECT_CONTAINS(err, "16000 Hz");
  EXPECT_CONTAINS(err, "resample_audio");
}

// librosa.load(audio_44k.wav, sr=16000): python-soxr at quality HQ, then the length fixed to
// ceil(22087 * 16000 / 44100) = 8014 (soxr itself writes 8013 samples; librosa appends a zero).
TEST(AudioResample, MatchesPythonSoxrHQ) {
  const AudioClip clip = read_audio_file(kResampleDir + "/audio_44k.wav");
  ASSERT_EQ(clip.sample_rate, 44100);
  ASSERT_EQ(clip.samples.size(), 22087u);

  const AudioClip out = resample_audio(clip, 16000);
  EXPECT_EQ(out.sample_rate, 16000);
  const at::Tensor expected =
      SafetensorsFile::open(kResampleDir + "/expected.safetensors").tensor("samples_16k");
  ASSERT_EQ(expected.sizes(), (std::vector<int64_t>{8014}));
  ASSERT_EQ(static_cast<int64_t>(out.samples.size()), expected.size(0));
  EXPECT_EQ(out.samples.back(), 0.0f);  // librosa's fix_length padding

  const at::Tensor got =
      at::from_blob(const_cast<float*>(out.samples.data()), {expected.size(0)}, at::kFloat);
  const double max_diff = (got - expected).abs().max().item<double>();
  std::cout << "[ audio ] max |resample_audio - python-soxr HQ| (44.1 -> 16 kHz): " << max_diff
            << "\n";
  ::testing::Test::RecordProperty("max_abs_diff", std::to_string(max_diff));
  EXPECT_LE(max_diff, 1e-6);
}

// What ThinkerRunner::prepare does with a 44.1 kHz file, against HF's WhisperFeatureExtractor
// on librosa.load(sr=16000) of the same file.
TEST(AudioResample, ResampledFeaturesMatchHuggingFace) {
  const AudioClip clip = read_audio_file(kResampleDir + "/audio_44k.wav");
  const WhisperFeatureOptions opt = whisper_options_from_preprocessor_config(kFixtureDir);
  const at::Tensor features = whisper_log_mel(resample_audio(clip, opt.sampling_rate), opt);
  const at::Tensor expected =
      SafetensorsFile::open(kResampleDir + "/expected.safetensors").tensor("input_features");
  ASSERT_EQ(expected.sizes(), (std::vector<int64_t>{128, 50}));
  ASSERT_EQ(features.sizes(), expected.sizes());
  const double max_diff = (features - expected).abs().max().item<double>();
  std::cout << "[ audio ] max |C++ - HF| of input_features after resampling: " << max_diff << "\n";
  ::testing::Test::RecordProperty("max_abs_diff", std::to_string(max_diff));
  EXPECT_LE(max_diff, 1e-4);
}

TEST(AudioResample, SameRateIsUnchanged) {
  AudioClip clip;
  clip.sample_rate = 16000;
  for (int16_t s : pcm_ramp(777, 5)) clip.samples.push_back(static_cast<float>(s) / 32768.0f);
  const AudioClip out = resample_audio(clip, 16000);
  EXPECT_EQ(out.sample_rate, 16000);
  EXPECT_EQ(out.samples, clip.samples);
}

// librosa's output length, ceil(n * (target / rate)), up and down, and a steady signal keeps its
// level away from the edges.
TEST(AudioResample, LengthIsCeilOfScaledInput) {
  const struct {
    int64_t rate, target;
    size_t n, expected;
  } cases[] = {{44100, 16000, 22050, 8000}, {44100, 16000, 1001, 364}, {16000, 44100, 1000, 2757},
               {48000, 16000, 4801, 1601},  {8000, 16000, 333, 666},   {22050, 16000, 0, 0}};
  for (const auto& c : cases) {
    AudioClip clip;
    clip.sample_rate = c.rate;
    clip.samples.assign(c.n, 0.5f);
    const AudioClip out = resample_audio(clip, c.target);
    EXPECT_EQ(out.sample_rate, c.target);
    EXPECT_EQ(out.samples.size(), c.expected) << c.rate << " -> " << c.target << ", n = " << c.n;
    EXPECT_EQ(out.samples.size(),
              static_cast<size_t>(
                  std::ceil(static_cast<double>(c.n) * (static_cast<double>(c.target) / c.rate))));
    if (out.samples.size() >= 200) {
      EXPECT_NEAR(out.samples[out.samples.size() / 2], 0.5f, 1e-3f);
    }
  }
}

TEST(AudioResample, BadRatesAreRejected) {
  AudioClip clip;
  clip.sample_rate = 44100;
  clip.samples.assign(100, 0.1f);
  std::string err = error_of([&] { resample_audio(clip, 0); });
  EXPECT_CONTAINS(err, "0 Hz");
  EXPECT_CONTAINS(err, "44100 Hz");
  clip.sample_rate = -8000;
  err = error_of([&] { resample_audio(clip, 16000); });
  EXPECT_CONTAINS(err, "-8000 Hz");
  EXPECT_CONTAINS(err, "16000 Hz");
}

TEST(AudioFeatures, TooShortClipIsRejected) {
  AudioClip clip;
  clip.sample_rate = 16000;
  clip.samples.assign(150, 0.1f);
  const std::string err = error_of([&] { whisper_log_mel(clip, WhisperFeatureOptions{}); });
  EXPECT_CONTAINS(err, "150 samples");
  EXPECT_CONTAINS(err, "too short");
}

TEST_F(AudioFileTest, StereoIsMixedDownByAveraging) {
  const std::vector<int16_t> pcm = pcm_ramp(2 * 1000, 3);  // 1000 frames, L R interleaved
  const std::string wav = path("stereo.wav");
  write_pcm16(wav, pcm, /*channels=*/2, /*sample_rate=*/22050);
  const AudioClip clip = read_audio_file(wav);
  EXPECT_EQ(clip.sample_rate, 22050);
  ASSERT_EQ(clip.samples.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) {
    const float left = static_cast<float>(pcm[2 * i]) / 32768.0f;
    const float right = static_cast<float>(pcm[2 * i + 1]) / 32768.0f;
    ASSERT_EQ(clip.samples[i], (left + right) / 2.0f) << "frame " << i;
  }
}

TEST_F(AudioFileTest, SevenPointOneIsMixedDownByAveraging) {
  const std::vector<int16_t> pcm = pcm_ramp(8 * 500, 5);
  const std::string wav = path("surround.wav");
  write_pcm16(wav, pcm, /*channels=*/8, /*sample_rate=*/48000);
  const AudioClip clip = read_audio_file(wav);
  ASSERT_EQ(clip.samples.size(), 500u);
  for (size_t i = 0; i < 500; ++i) {
    float sum = static_cast<float>(pcm[8 * i]) / 32768.0f;
    for (size_t c = 1; c < 8; ++c) sum += static_cast<float>(pcm[8 * i + c]) / 32768.0f;
    ASSERT_EQ(clip.samples[i], sum / 8.0f) << "frame " << i;
  }
}

// A 16 KiB PCM WAV whose header declares `channels` channels (as many silent frames as fit),
// written byte by byte so that any count can be declared.
std::string silent_wav(uint16_t channels) {
  std::string b;
  const auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  const auto u16 = [&](uint16_t v) {
    b.push_back(static_cast<char>(v & 0xff));
    b.push_back(static_cast<char>(v >> 8));
  };
  const uint32_t data = 16384 - 44;
  b += "RIFF";
  u32(36 + data);
  b += "WAVEfmt ";
  u32(16);
  u16(1);  // PCM
  u16(channels);
  u32(16000);
  u32(16000u * 2 * channels);
  u16(static_cast<uint16_t>(2 * channels));
  u16(16);
  b += "data";
  u32(data);
  b.append(data, '\0');
  return b;
}

// Channels past the limit are refused on the header, before a sample buffer exists: 1,024 of
// them made a 16 KiB upload cost a 256 MiB block.
TEST_F(AudioFileTest, TooManyChannelsAreRefusedBeforeDecoding) {
  const std::string bytes = silent_wav(1024);
  const auto decode = [&](const AudioLimits& limits) {
    return decode_audio(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "input-0.wav",
                        limits);
  };
  EXPECT_CONTAINS(error_of([&] { decode({}); }),
                  "audio 'input-0.wav' has 1024 channels: at most 8 are accepted");
  write_bytes(path("many.wav"), bytes);
  EXPECT_CONTAINS(error_of([&] { read_audio_file(path("many.wav")); }),
                  "audio file '" + path("many.wav") + "' has 1024 channels");
  // Allowed, they decode, in a block of 2 MiB (it was 256 MiB: 2^16 frames of 1,024 floats).
  AudioLimits limits;
  limits.max_channels = 1024;
  AudioClip clip;
  const auto growth = peak_rss_growth([&] { clip = decode(limits); });
  EXPECT_EQ(clip.samples, std::vector<float>(7, 0.0f));
  if (growth) {
    EXPECT_LT(*growth, size_t{32} << 20);
  }
  EXPECT_EQ(read_audio_file(path("many.wav"), limits).samples.size(), 7u);
}

TEST_F(AudioFileTest, FlacDecodesLikeWav) {
  const std::vector<int16_t> pcm = pcm_ramp(5000, 11);
  write_pcm16(path("a.wav"), pcm, 1, 16000, SF_FORMAT_WAV);
  write_pcm16(path("a.flac"), pcm, 1, 16000, SF_FORMAT_FLAC);
  const AudioClip wav = read_audio_file(path("a.wav"));
  const AudioClip flac = read_audio_file(path("a.flac"));
  ASSERT_EQ(wav.samples.size(), pcm.size());
  EXPECT_EQ(flac.samples, wav.samples);
  EXPECT_EQ(flac.sample_rate, 16000);
  // soundfile.read(dtype="float32"): int16 / 32768.
  for (size_t i = 0; i < pcm.size(); ++i) {
    ASSERT_EQ(wav.samples[i], static_cast<float>(pcm[i]) / 32768.0f) << "sample " << i;
  }
}

// An upload decodes from memory to the samples its file gives, in every format; its errors name
// it.
TEST_F(AudioFileTest, BytesInMemoryDecodeLikeTheFile) {
  const std::vector<int16_t> pcm = pcm_ramp(2 * 3000, 7);
  for (const int format : {SF_FORMAT_WAV, SF_FORMAT_FLAC}) {
    const std::string file = path(format == SF_FORMAT_WAV ? "m.wav" : "m.flac");
    write_pcm16(file, pcm, /*channels=*/2, /*sample_rate=*/24000, format);
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const AudioClip from_file = read_audio_file(file);
    const AudioClip from_memory =
        decode_audio(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "upload");
    EXPECT_EQ(from_memory.samples, from_file.samples);
    EXPECT_EQ(from_memory.sample_rate, 24000);
    AudioLimits limits;
    limits.max_seconds = 0.05;  // 3000 frames at 24 kHz last 0.125 s
    const std::string err = error_of([&] {
      decode_audio(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "upload", limits);
    });
    EXPECT_CONTAINS(err, "audio 'upload' lasts");
  }
  const std::string text = "this is not a RIFF file at all, just some text\n";
  const std::string err = error_of([&] {
    decode_audio(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "input-0.wav");
  });
  EXPECT_CONTAINS(err, "audio 'input-0.wav' cannot be decoded");
}

TEST_F(AudioFileTest, FileErrorsNameThePath) {
  const std::string missing = path("no_such_clip.wav");
  std::string err = error_of([&] { read_audio_file(missing); });
  EXPECT_CONTAINS(err, missing);
  EXPECT_CONTAINS(err, "does not exist");

  err = error_of([&] { read_audio_file(dir()); });
  EXPECT_CONTAINS(err, "is a directory");

  const std::string text = path("notes.wav");
  write_bytes(text, "this is not a RIFF file at all, just some text\n");
  err = error_of([&] { read_audio_file(text); });
  EXPECT_CONTAINS(err, text);
  EXPECT_CONTAINS(err, "cannot be decoded");

  const std::string empty_file = path("empty.wav");
  write_bytes(empty_file, "");
  err = error_of([&] { read_audio_file(empty_file); });
  EXPECT_CONTAINS(err, empty_file);

  const std::string no_frames = path("silence.wav");
  write_pcm16(no_frames, {}, 1, 16000);
  err = error_of([&] { read_audio_file(no_frames); });
  EXPECT_CONTAINS(err, no_frames);
  EXPECT_CONTAINS(err, "no samples");
}

TEST_F(AudioFileTest, PreprocessorConfig) {
  // The fixture's preprocessor_config.json, by directory and by file.
  WhisperFeatureOptions opt = whisper_options_from_preprocessor_config(kFixtureDir);
  EXPECT_EQ(opt.feature_size, 128);
  EXPECT_EQ(opt.sampling_rate, 16000);
  EXPECT_EQ(opt.hop_length, 160);
  EXPECT_EQ(opt.n_fft, 400);
  opt = whisper_options_from_preprocessor_config(kFixtureDir + "/preprocessor_config.json");
  EXPECT_EQ(opt.feature_size, 128);

  // A directory without one: the defaults. A named file that is missing: an error.
  opt = whisper_options_from_preprocessor_config(dir());
  EXPECT_EQ(opt.feature_size, 128);
  EXPECT_EQ(opt.sampling_rate, 16000);
  EXPECT_EQ(opt.hop_length, 160);
  EXPECT_EQ(opt.n_fft, 400);
  const std::string missing = path("nope/preprocessor_config.json");
  EXPECT_CONTAINS(error_of([&] { whisper_options_from_preprocessor_config(missing); }), missing);

  // Fields are read; absent ones keep their default.
  write_bytes(path("preprocessor_config.json"),
              R"({"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
                  "hop_length": 200, "dither": 0.0})");
  opt = whisper_options_from_preprocessor_config(dir());
  EXPECT_EQ(opt.feature_size, 80);
  EXPECT_EQ(opt.hop_length, 200);
  EXPECT_EQ(opt.sampling_rate, 16000);
  EXPECT_EQ(opt.n_fft, 400);

  write_bytes(path("preprocessor_config.json"), R"({"feature_size": 128, "dither": 0.0001})");
  std::string err = error_of([&] { whisper_options_from_preprocessor_config(dir()); });
  EXPECT_CONTAINS(err, path("preprocessor_config.json"));
  EXPECT_CONTAINS(err, "dither");

  write_bytes(path("preprocessor_config.json"), R"({"hop_length": 0})");
  err = error_of([&] { whisper_options_from_preprocessor_config(dir()); });
  EXPECT_CONTAINS(err, "hop_length must be positive");

  write_bytes(path("preprocessor_config.json"),
              R"({"feature_extractor_type": "SeamlessM4TFeatureExtractor"})");
  err = error_of([&] { whisper_options_from_preprocessor_config(dir()); });
  EXPECT_CONTAINS(err, "SeamlessM4TFeatureExtractor");
}

}  // namespace
}  // namespace omni::models
