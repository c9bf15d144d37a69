// Audio files through libsndfile: the library python's soundfile wraps, and sf_readf_float is
// the call soundfile.read(dtype="float32") makes, so samples match the Python reference bit for
// bit (PCM16 becomes int16 / 32768).
#include <sndfile.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/audio.h"

namespace omni::models {
namespace {

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using SndfileHandle = std::unique_ptr<SNDFILE, SndfileCloser>;

}  // namespace

AudioClip read_audio_file(const std::string& path, const AudioLimits& limits) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    OMNI_THROW("audio file '", path, "' does not exist");
  }
  if (std::filesystem::is_directory(status)) {
    OMNI_THROW("audio file '", path, "' is a directory, not a file");
  }

  SF_INFO info{};
  SndfileHandle file(sf_open(path.c_str(), SFM_READ, &info));
  if (!file) {
    // sf_strerror(nullptr) describes why the last sf_open failed ("Format not recognised.",
    // "File contains data in an unknown format.", a system error, ...).
    OMNI_THROW("audio file '", path,
               "' cannot be decoded (libsndfile reads WAV, FLAC, OGG/Vorbis, AIFF, ...): ",
               sf_strerror(nullptr));
  }
  OMNI_CHECK(info.channels > 0, "audio file '", path, "' has ", info.channels, " channels");
  if (info.samplerate < limits.min_sample_rate || info.samplerate > limits.max_sample_rate) {
    OMNI_THROW("audio file '", path, "' has a sample rate of ", info.samplerate,
               " Hz: it must be between ", limits.min_sample_rate, " and ", limits.max_sample_rate,
               " Hz");
  }
  const auto max_frames = static_cast<int64_t>(limits.max_seconds * info.samplerate);
  const auto too_long = [&](const char* lasts, int64_t frames) {
    OMNI_THROW("audio file '", path, "' lasts ", lasts,
               static_cast<double>(frames) / info.samplerate, " s: at most ", limits.max_seconds,
               " s are accepted");
  };
  if (limits.max_seconds > 0 && info.frames > max_frames) too_long("", info.frames);

  // Read in blocks until the end rather than trusting info.frames, which some containers
  // (streams, truncated files) do not state exactly.
  const int64_t channels = info.channels;
  AudioClip clip;
  clip.sample_rate = info.samplerate;
  if (info.frames > 0 && info.frames < (int64_t{1} << 34)) {
    clip.samples.reserve(static_cast<size_t>(info.frames));
  }
  constexpr sf_count_t kBlockFrames = 1 << 16;
  std::vector<float> block(static_cast<size_t>(kBlockFrames * channels));
  while (true) {
    const sf_count_t n = sf_readf_float(file.get(), block.data(), kBlockFrames);
    if (n <= 0) break;
    if (limits.max_seconds > 0 && static_cast<int64_t>(clip.samples.size()) + n > max_frames) {
      too_long("over ", static_cast<int64_t>(clip.samples.size()) + n);
    }
    if (channels == 1) {
      clip.samples.insert(clip.samples.end(), block.begin(), block.begin() + n);
      continue;
    }
    // librosa.to_mono: numpy's float32 mean over the channel axis (sum in channel order,
    // then divide by the count).
    const float count = static_cast<float>(channels);
    for (sf_count_t i = 0; i < n; ++i) {
      const float* frame = block.data() + i * channels;
      float sum = frame[0];
      for (int64_t c = 1; c < channels; ++c) sum += frame[c];
      clip.samples.push_back(sum / count);
    }
  }
  const int err = sf_error(file.get());
  if (err != SF_ERR_NO_ERROR) {
    OMNI_THROW("audio file '", path, "': decoding failed after ", clip.samples.size(),
               " frames: ", sf_error_number(err));
  }
  if (clip.samples.empty()) {
    OMNI_THROW("audio file '", path, "' holds no samples (0 frames at ", info.samplerate, " Hz)");
  }
  return clip;
}

}  // namespace omni::models
