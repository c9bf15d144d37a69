// Audio files through libsndfile: the library python's soundfile wraps, and sf_readf_float is
// the call soundfile.read(dtype="float32") makes, so samples match the Python reference bit for
// bit (PCM16 becomes int16 / 32768).
#include <sndfile.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
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

// Bytes in memory as libsndfile's virtual file.
struct MemoryFile {
  const uint8_t* data;
  sf_count_t size;
  sf_count_t at = 0;
};

sf_count_t memory_length(void* user) { return static_cast<MemoryFile*>(user)->size; }
sf_count_t memory_seek(sf_count_t offset, int whence, void* user) {
  auto* m = static_cast<MemoryFile*>(user);
  const sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->at : m->size;
  const sf_count_t to = base + offset;
  if (to < 0 || to > m->size) return -1;
  m->at = to;
  return m->at;
}
sf_count_t memory_read(void* out, sf_count_t count, void* user) {
  auto* m = static_cast<MemoryFile*>(user);
  const sf_count_t n = std::max<sf_count_t>(0, std::min(count, m->size - m->at));
  std::memcpy(out, m->data + m->at, static_cast<size_t>(n));
  m->at += n;
  return n;
}
sf_count_t memory_write(const void*, sf_count_t, void*) { return 0; }
sf_count_t memory_tell(void* user) { return static_cast<MemoryFile*>(user)->at; }

// Decodes an open file; `what` names it in errors ("audio file 'x.wav'").
AudioClip decode(SNDFILE* opened, const SF_INFO& info, const std::string& what,
                 const AudioLimits& limits) {
  SndfileHandle file(opened);
  if (!file) {
    // sf_strerror(nullptr) describes why the last sf_open failed ("Format not recognised.",
    // "File contains data in an unknown format.", a system error, ...).
    OMNI_THROW(what, " cannot be decoded (libsndfile reads WAV, FLAC, OGG/Vorbis, AIFF, ...): ",
               sf_strerror(nullptr));
  }
  OMNI_CHECK(info.channels > 0, what, " has ", info.channels, " channels");
  if (info.channels > limits.max_channels) {
    OMNI_THROW(what, " has ", info.channels, " channels: at most ", limits.max_channels,
               " are accepted");
  }
  if (info.samplerate < limits.min_sample_rate || info.samplerate > limits.max_sample_rate) {
    OMNI_THROW(what, " has a sample rate of ", info.samplerate, " Hz: it must be between ",
               limits.min_sample_rate, " and ", limits.max_sample_rate, " Hz");
  }
  const auto max_frames = static_cast<int64_t>(limits.max_seconds * info.samplerate);
  const auto too_long = [&](const char* lasts, int64_t frames) {
    OMNI_THROW(what, " lasts ", lasts, static_cast<double>(frames) / info.samplerate,
               " s: at most ", limits.max_seconds, " s are accepted");
  };
  if (limits.max_seconds > 0 && info.frames > max_frames) too_long("", info.frames);

  // Read in blocks until the end rather than trusting info.frames, which some containers
  // (streams, truncated files) do not state exactly. Nor does it size the clip past 16 MiB up
  // front: a header may claim hours that a short file does not hold.
  const int64_t channels = info.channels;
  AudioClip clip;
  clip.sample_rate = info.samplerate;
  if (info.frames > 0) {
    clip.samples.reserve(static_cast<size_t>(std::min<int64_t>(info.frames, int64_t{1} << 22)));
  }
  // 2^16 frames a block, fewer past 8 channels: its size stays bounded whatever the limits.
  constexpr sf_count_t kBlockSamples = sf_count_t{8} << 16;
  const sf_count_t block_frames =
      std::min<sf_count_t>(1 << 16, std::max<sf_count_t>(1, kBlockSamples / channels));
  std::vector<float> block(static_cast<size_t>(block_frames * channels));
  while (true) {
    const sf_count_t n = sf_readf_float(file.get(), block.data(), block_frames);
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
    OMNI_THROW(what, ": decoding failed after ", clip.samples.size(),
               " frames: ", sf_error_number(err));
  }
  if (clip.samples.empty()) {
    OMNI_THROW(what, " holds no samples (0 frames at ", info.samplerate, " Hz)");
  }
  return clip;
}

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
  SNDFILE* file = sf_open(path.c_str(), SFM_READ, &info);
  return decode(file, info, "audio file '" + path + "'", limits);
}

AudioClip decode_audio(const uint8_t* data, size_t size, const std::string& name,
                       const AudioLimits& limits) {
  MemoryFile memory{data, static_cast<sf_count_t>(size)};
  SF_VIRTUAL_IO io{memory_length, memory_seek, memory_read, memory_write, memory_tell};
  SF_INFO info{};
  SNDFILE* file = sf_open_virtual(&io, SFM_READ, &info, &memory);
  return decode(file, info, "audio '" + name + "'", limits);
}

}  // namespace omni::models
