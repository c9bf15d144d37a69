// WAV bytes in memory: what libsndfile writes to disk, readable back, clamped.
#include "worker/http/wav_bytes.h"

#include <gtest/gtest.h>
#include <sndfile.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace omni::http {
namespace {

// A file in the test's temporary folder, removed at the end of the scope.
class TempPath {
 public:
  TempPath() {
    const char* dir = std::getenv("TMPDIR");
    std::string pattern =
        std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/wav_bytes_test_XXXXXX";
    const int fd = ::mkstemp(pattern.data());
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    path_ = pattern;
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Decoded {
  SF_INFO info{};
  std::vector<short> pcm;
  std::vector<float> samples;
};

// Opened with sf_open from a file, as a player or soundfile would.
Decoded decode(const std::string& bytes) {
  TempPath file;
  write_file(file.path(), bytes);
  Decoded d;
  SNDFILE* sf = sf_open(file.path().c_str(), SFM_READ, &d.info);
  if (sf == nullptr) {
    ADD_FAILURE() << "libsndfile cannot open the bytes: " << sf_strerror(nullptr);
    return d;
  }
  d.pcm.resize(static_cast<size_t>(d.info.frames));
  d.samples.resize(static_cast<size_t>(d.info.frames));
  EXPECT_EQ(sf_readf_short(sf, d.pcm.data(), d.info.frames), d.info.frames);
  sf_seek(sf, 0, SEEK_SET);
  EXPECT_EQ(sf_readf_float(sf, d.samples.data(), d.info.frames), d.info.frames);
  sf_close(sf);
  return d;
}

std::vector<float> random_samples(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> s(n);
  for (float& x : s) x = dist(rng);
  return s;
}

TEST(WavBytes, ReadsBackAs24kHzMonoPcm16) {
  const auto samples = random_samples(24000 + 17, 1);
  const std::string bytes = wav_bytes(samples.data(), samples.size(), 24000);
  EXPECT_EQ(bytes.substr(0, 4), "RIFF");
  EXPECT_EQ(bytes.substr(8, 4), "WAVE");
  EXPECT_EQ(bytes.size(), 44 + samples.size() * 2);
  const Decoded d = decode(bytes);
  EXPECT_EQ(d.info.samplerate, 24000);
  EXPECT_EQ(d.info.channels, 1);
  EXPECT_EQ(d.info.format, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
  ASSERT_EQ(d.pcm.size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    // libsndfile writes round(x * 32767) ...
    EXPECT_LE(std::abs(d.pcm[i] - samples[i] * 32767.0f), 0.5f + 1e-3f) << i;
    // ... so the 16-bit value is within one step of the input.
    EXPECT_LE(std::abs(d.pcm[i] / 32767.0f - samples[i]), 1.0f / 32767) << i;
    // Read as float, libsndfile divides by 32768: one more step of difference at full scale.
    EXPECT_LE(std::abs(d.samples[i] - samples[i]), 2.0f / 32767) << i;
  }
}

TEST(WavBytes, AreTheBytesLibsndfileWritesToDisk) {
  auto samples = random_samples(5000, 2);
  samples[10] = 1.7f;  // clamped, as the file writer of the runner does
  const std::string bytes = wav_bytes(samples.data(), samples.size(), 24000);
  for (float& x : samples) x = std::min(1.0f, std::max(-1.0f, x));
  TempPath file;
  SF_INFO info{};
  info.samplerate = 24000;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
  SNDFILE* sf = sf_open(file.path().c_str(), SFM_WRITE, &info);
  ASSERT_NE(sf, nullptr) << sf_strerror(nullptr);
  ASSERT_EQ(sf_writef_float(sf, samples.data(), static_cast<sf_count_t>(samples.size())),
            static_cast<sf_count_t>(samples.size()));
  ASSERT_EQ(sf_close(sf), 0);
  EXPECT_EQ(bytes, read_file(file.path()));
}

TEST(WavBytes, ClampsToFullScale) {
  const float samples[] = {1.5f,
                           -3.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           1.0f,
                           -1.0f,
                           0.0f};
  const Decoded d = decode(wav_bytes(samples, std::size(samples), 24000));
  const std::vector<short> expected = {32767, -32767, 32767, -32767, 32767, -32767, 0};
  EXPECT_EQ(d.pcm, expected);
}

TEST(WavBytes, ZeroSamplesIsStillAValidFile) {
  const std::string bytes = wav_bytes(nullptr, 0, 24000);
  EXPECT_EQ(bytes.size(), 44u);
  const Decoded d = decode(bytes);
  EXPECT_EQ(d.info.frames, 0);
  EXPECT_EQ(d.info.samplerate, 24000);
  EXPECT_EQ(d.info.channels, 1);
  EXPECT_EQ(d.info.format, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
}

TEST(WavBytes, OtherSampleRates) {
  const auto samples = random_samples(100, 3);
  EXPECT_EQ(decode(wav_bytes(samples.data(), samples.size(), 16000)).info.samplerate, 16000);
}

TEST(WavBytes, RefusesNanAndBadRates) {
  const float nan[] = {0.0f, std::nanf("")};
  EXPECT_THROW(wav_bytes(nan, 2, 24000), std::invalid_argument);
  const float ok[] = {0.0f};
  EXPECT_THROW(wav_bytes(ok, 1, 0), std::invalid_argument);
  EXPECT_THROW(wav_bytes(ok, 1, -24000), std::invalid_argument);
}

}  // namespace
}  // namespace omni::http
