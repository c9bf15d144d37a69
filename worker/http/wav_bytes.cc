#include "worker/http/wav_bytes.h"

#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace omni::http {
namespace {

// The file libsndfile writes: a growable buffer with a position, seekable (libsndfile seeks
// back to fill in the RIFF and data sizes when it closes the file).
struct MemoryFile {
  std::string bytes;
  sf_count_t position = 0;
};

sf_count_t mem_length(void* user) {
  return static_cast<sf_count_t>(static_cast<MemoryFile*>(user)->bytes.size());
}

sf_count_t mem_seek(sf_count_t offset, int whence, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  sf_count_t base = 0;
  if (whence == SEEK_CUR) base = f->position;
  if (whence == SEEK_END) base = static_cast<sf_count_t>(f->bytes.size());
  if (base + offset < 0) return -1;
  f->position = base + offset;
  return f->position;
}

sf_count_t mem_read(void* ptr, sf_count_t count, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  const auto size = static_cast<sf_count_t>(f->bytes.size());
  const sf_count_t n = std::max<sf_count_t>(0, std::min(count, size - f->position));
  if (n > 0) std::memcpy(ptr, f->bytes.data() + f->position, static_cast<size_t>(n));
  f->position += n;
  return n;
}

sf_count_t mem_write(const void* ptr, sf_count_t count, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  const auto end = static_cast<size_t>(f->position + count);
  if (end > f->bytes.size()) f->bytes.resize(end);  // a seek past the end leaves zeros
  std::memcpy(f->bytes.data() + f->position, ptr, static_cast<size_t>(count));
  f->position += count;
  return count;
}

sf_count_t mem_tell(void* user) { return static_cast<MemoryFile*>(user)->position; }

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};

}  // namespace

std::string wav_bytes(const float* samples, size_t count, int sample_rate) {
  if (sample_rate <= 0) {
    throw std::invalid_argument("wav_bytes: sample rate must be positive, got " +
                                std::to_string(sample_rate));
  }
  // Checked before writing anything: clamping would turn a NaN into an arbitrary value.
  for (size_t i = 0; i < count; ++i) {
    if (std::isnan(samples[i])) {
      throw std::invalid_argument("wav_bytes: sample " + std::to_string(i) + " of " +
                                  std::to_string(count) + " is NaN");
    }
  }
  // Clamped in blocks: a stream chunk is small, but a whole reply may be minutes of audio.
  constexpr size_t kBlock = size_t{1} << 14;
  std::vector<float> block(std::min(count, kBlock));

  MemoryFile file;
  file.bytes.reserve(44 + count * 2);
  SF_VIRTUAL_IO io{mem_length, mem_seek, mem_read, mem_write, mem_tell};
  SF_INFO info{};
  info.samplerate = sample_rate;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
  std::unique_ptr<SNDFILE, SndfileCloser> sf(sf_open_virtual(&io, SFM_WRITE, &info, &file));
  if (!sf) throw std::runtime_error(std::string("wav_bytes: libsndfile: ") + sf_strerror(nullptr));
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(kBlock, count - done);
    for (size_t i = 0; i < n; ++i) block[i] = std::clamp(samples[done + i], -1.0f, 1.0f);
    const auto written = sf_writef_float(sf.get(), block.data(), static_cast<sf_count_t>(n));
    if (written != static_cast<sf_count_t>(n)) {
      throw std::runtime_error(std::string("wav_bytes: libsndfile: ") + sf_strerror(sf.get()));
    }
    done += n;
  }
  // sf_close writes the final RIFF and data chunk sizes into the header.
  const int err = sf_close(sf.release());
  if (err != SF_ERR_NO_ERROR) {
    throw std::runtime_error(std::string("wav_bytes: libsndfile: ") + sf_error_number(err));
  }
  return std::move(file.bytes);
}

}  // namespace omni::http
