// Writes a waveform to a WAV file through libsndfile (mono, PCM16 or float32), atomically: the
// samples go to a temporary file in the target's folder that replaces the target only after a
// successful close, so a failed or interrupted run never leaves a half-written WAV behind.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace omni::models {

enum class WavFormat { kPcm16, kFloat32 };

// "pcm16" | "f32"; anything else throws omni::Error listing both.
WavFormat parse_wav_format(const std::string& text);
std::string to_string(WavFormat format);

// Writes `samples` ([n], any floating dtype, any device; converted to float32 on the CPU) as a
// mono WAV at `sample_rate` Hz.
//
// kPcm16: libsndfile's default float -> int16 conversion, the one python's soundfile.write
// uses: lrintf(x * 32767), round half to even, so -1 -> -32767, 0.5 -> 16384, 1 -> 32767.
// libsndfile wraps values outside [-1, 1] around (1.5 would become a loud negative sample),
// so samples are clamped to [-1, 1] first: in-range audio (what code2wav makes) is written
// exactly as soundfile writes it, anything louder saturates at +-32767.
// kFloat32: the samples bit for bit (IEEE float WAV with a PEAK chunk, as soundfile writes).
//
// Throws omni::Error, and leaves neither the target nor a temporary file, when `samples` is not
// 1-D floating point, holds a NaN or an infinity (named by index: a waveform like that is a bug
// upstream, and PCM has no way to say it), `sample_rate` is not positive, the folder does not
// exist or cannot be written, the target is a directory, or a write fails (disk full, ...).
// An existing target is replaced.
void write_wav(const std::string& path, const at::Tensor& samples, int64_t sample_rate,
               WavFormat format);

// A whole sound file as libsndfile reads it (for tests and tools).
struct WavContents {
  at::Tensor samples;  // [frames, channels]: int16 as stored for kShort, float32 for kFloat
  int64_t sample_rate = 0;
  int64_t channels = 0;
  int64_t frames = 0;
  int format = 0;  // libsndfile's SF_FORMAT_* bits (container | subtype)
};

// `dtype`: at::kFloat (PCM scaled by 1 / 32768, as soundfile.read) or at::kShort (PCM16 as
// stored; float files are converted by libsndfile). Throws omni::Error naming the file.
WavContents read_wav(const std::string& path, at::ScalarType dtype = at::kFloat);

}  // namespace omni::models
