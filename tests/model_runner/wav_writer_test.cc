// write_wav / read_wav: PCM16 values exactly as soundfile.write makes them, float32 bit for bit,
// the header read back by libsndfile, and no file (target or temporary) after a failure.
#include "model_runner/output/wav_writer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sndfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "weights_test_util.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_bytes;
using testing::write_bytes;

class WavWriterTest : public testing::TempDirTest {
 protected:
  // Names in the test directory, so a leftover temporary file shows.
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir())) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }
};

at::Tensor floats(const std::vector<float>& v) {
  return at::tensor(at::ArrayRef<float>(v), at::kFloat);
}

std::vector<int16_t> shorts_of(const WavContents& wav) {
  const auto t = wav.samples.contiguous();
  return std::vector<int16_t>(t.data_ptr<int16_t>(), t.data_ptr<int16_t>() + t.numel());
}

TEST_F(WavWriterTest, Pcm16HasSoundfilesValuesForKnownSamples) {
  // x * 32767 (in float) rounded half to even: 0.75 -> 24575.25 -> 24575, 0.5 -> 16383.5 ->
  // 16384, 0x1.40028p-14 -> exactly 2.5 -> 2 (not 3); out-of-range samples saturate where
  // libsndfile alone would wrap 1.5 around to -16386.
  const std::vector<float> x = {0.0f,  1.0f,           -1.0f,           0.5f, -0.5f,
                                0.75f, 0x1.40028p-14f, -0x1.40028p-14f, 1.5f, -1.5f};
  const std::vector<int16_t> expected = {0,     32767, -32767, 16384, -16384,
                                         24575, 2,     -2,     32767, -32767};
  write_wav(path("a.wav"), floats(x), 24000, WavFormat::kPcm16);
  const WavContents wav = read_wav(path("a.wav"), at::kShort);
  EXPECT_EQ(shorts_of(wav), expected);
  EXPECT_EQ(wav.sample_rate, 24000);
  EXPECT_EQ(wav.channels, 1);
  EXPECT_EQ(wav.frames, static_cast<int64_t>(x.size()));
  EXPECT_EQ(wav.format, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
  EXPECT_EQ(listing(), (std::set<std::string>{"a.wav"}));
}

TEST_F(WavWriterTest, Pcm16RoundsLikeSoundfileOnRandomSamples) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(20000);
  for (auto& v : x) v = dist(rng);
  write_wav(path("r.wav"), floats(x), 16000, WavFormat::kPcm16);
  const auto got = shorts_of(read_wav(path("r.wav"), at::kShort));
  ASSERT_EQ(got.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    // soundfile: libsndfile's lrintf(x * 32767.0f) in the default rounding mode.
    ASSERT_EQ(got[i], static_cast<int16_t>(std::nearbyint(x[i] * 32767.0f))) << i << ": " << x[i];
  }
  // read as float, PCM16 is scaled by 1 / 32768 (soundfile.read's convention).
  const auto as_float = read_wav(path("r.wav"), at::kFloat).samples;
  EXPECT_FLOAT_EQ(as_float[0][0].item<float>(), got[0] / 32768.0f);
}

TEST_F(WavWriterTest, Float32RoundTripsBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.7f);
  std::vector<float> x(12345);
  for (auto& v : x) v = dist(rng);
  x[0] = -0.0f;
  x[1] = std::numeric_limits<float>::denorm_min();
  x[2] = 3.5f;  // float WAVs keep values outside [-1, 1]
  x[3] = -1.0f;
  write_wav(path("f.wav"), floats(x), 24000, WavFormat::kFloat32);
  const WavContents wav = read_wav(path("f.wav"), at::kFloat);
  EXPECT_EQ(wav.format, SF_FORMAT_WAV | SF_FORMAT_FLOAT);
  EXPECT_EQ(wav.sample_rate, 24000);
  EXPECT_EQ(wav.channels, 1);
  ASSERT_EQ(wav.frames, static_cast<int64_t>(x.size()));
  EXPECT_EQ(
      std::memcmp(wav.samples.contiguous().data_ptr<float>(), x.data(), x.size() * sizeof(float)),
      0);
}

TEST_F(WavWriterTest, AcceptsOtherFloatingDtypesAndEmptyWaveforms) {
  write_wav(path("d.wav"), at::full({3}, 0.5, at::kDouble), 8000, WavFormat::kPcm16);
  EXPECT_EQ(shorts_of(read_wav(path("d.wav"), at::kShort)),
            (std::vector<int16_t>{16384, 16384, 16384}));
  write_wav(path("e.wav"), at::empty({0}, at::kFloat), 24000, WavFormat::kFloat32);
  const auto empty = read_wav(path("e.wav"));
  EXPECT_EQ(empty.frames, 0);
  EXPECT_EQ(empty.sample_rate, 24000);
}

TEST_F(WavWriterTest, ReplacesAnExistingFile) {
  write_wav(path("o.wav"), at::zeros({100}), 24000, WavFormat::kPcm16);
  write_wav(path("o.wav"), at::full({5}, 0.25), 24000, WavFormat::kPcm16);
  EXPECT_EQ(read_wav(path("o.wav"), at::kShort).frames, 5);
  EXPECT_EQ(listing(), (std::set<std::string>{"o.wav"}));
}

TEST_F(WavWriterTest, NonFiniteSamplesAreRefusedAndNothingIsWritten) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(10, 0.1f);
    x[7] = bad;
    for (const auto format : {WavFormat::kPcm16, WavFormat::kFloat32}) {
      const std::string error =
          error_of([&] { write_wav(path("n.wav"), floats(x), 24000, format); });
      EXPECT_CONTAINS(error, "sample 7 of 10");
      EXPECT_TRUE(listing().empty());
    }
  }
  // An existing target is left as it was.
  write_wav(path("keep.wav"), at::zeros({4}), 24000, WavFormat::kPcm16);
  const std::string before = read_bytes(path("keep.wav"));
  std::vector<float> x(4, 0.0f);
  x[2] = std::nanf("");
  EXPECT_THROW(write_wav(path("keep.wav"), floats(x), 24000, WavFormat::kPcm16), omni::Error);
  EXPECT_EQ(read_bytes(path("keep.wav")), before);
  EXPECT_EQ(listing(), (std::set<std::string>{"keep.wav"}));
}

TEST_F(WavWriterTest, ADirectoryAsTargetFailsAndLeavesNoTemporaryFile) {
  fs::create_directory(path("out.wav"));
  // The samples are written to a temporary file first; the rename onto the directory fails
  // and the temporary file must go.
  const std::string error =
      error_of([&] { write_wav(path("out.wav"), at::zeros({64}), 24000, WavFormat::kPcm16); });
  EXPECT_CONTAINS(error, "out.wav");
  EXPECT_CONTAINS(error, "directory");
  EXPECT_EQ(listing(), (std::set<std::string>{"out.wav"}));
  EXPECT_TRUE(fs::is_directory(path("out.wav")));
}

TEST_F(WavWriterTest, AMissingFolderFailsNamingIt) {
  const std::string target = path("missing/sub/out.wav");
  const std::string error =
      error_of([&] { write_wav(target, at::zeros({8}), 24000, WavFormat::kPcm16); });
  EXPECT_CONTAINS(error, path("missing/sub"));
  EXPECT_CONTAINS(error, "No such file or directory");
  EXPECT_TRUE(listing().empty());
}

TEST_F(WavWriterTest, AnUnwritableFolderFailsAndLeavesNothing) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only folders";
  fs::create_directory(path("ro"));
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  const std::string error =
      error_of([&] { write_wav(path("ro/out.wav"), at::zeros({8}), 24000, WavFormat::kPcm16); });
  fs::permissions(path("ro"), fs::perms::owner_all);
  EXPECT_CONTAINS(error, "Permission denied");
  EXPECT_TRUE(fs::is_empty(path("ro")));
}

TEST_F(WavWriterTest, BadArgumentsAreRefusedBeforeAnyFileExists) {
  EXPECT_CONTAINS(error_of([&] {
                    write_wav(path("a.wav"), at::zeros({2, 3}), 24000, WavFormat::kPcm16);
                  }),
                  "1-D");
  EXPECT_CONTAINS(error_of([&] {
                    write_wav(path("a.wav"), at::zeros({3}, at::kInt), 24000, WavFormat::kPcm16);
                  }),
                  "floating point");
  EXPECT_CONTAINS(error_of([&] { write_wav(path("a.wav"), at::zeros({3}), 0, WavFormat::kPcm16); }),
                  "sample rate");
  EXPECT_TRUE(listing().empty());
}

TEST(WavFormat, ParsesItsNamesAndListsThemOnError) {
  EXPECT_EQ(parse_wav_format("pcm16"), WavFormat::kPcm16);
  EXPECT_EQ(parse_wav_format("f32"), WavFormat::kFloat32);
  EXPECT_EQ(to_string(WavFormat::kPcm16), "pcm16");
  EXPECT_EQ(to_string(WavFormat::kFloat32), "f32");
  const std::string error = error_of([] { parse_wav_format("mp3"); });
  EXPECT_CONTAINS(error, "'mp3'");
  EXPECT_CONTAINS(error, "pcm16, f32");
}

TEST_F(WavWriterTest, ReadWavNamesAFileItCannotRead) {
  write_bytes(path("junk.wav"), "not a wav file at all");
  EXPECT_CONTAINS(error_of([&] { read_wav(path("junk.wav")); }), path("junk.wav"));
}

}  // namespace
}  // namespace omni::models
