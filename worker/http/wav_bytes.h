// A complete WAV file in memory, for audio in OpenAI responses (base64 in JSON and in each
// streamed chunk). Written by libsndfile through its virtual I/O, so the bytes are exactly what
// libsndfile (and Python's soundfile) write to disk for the same samples.
#pragma once

#include <cstddef>
#include <string>

namespace omni::http {

// RIFF WAV, PCM 16-bit, mono, `sample_rate` Hz. Samples are clamped to [-1, 1] first (libsndfile
// would wrap them around otherwise), then converted by libsndfile (round(x * 32767)). Each call
// is a complete file: every chunk of a stream is playable on its own, and 0 samples still make a
// valid (empty) file. Throws std::invalid_argument for a sample rate <= 0 or a NaN sample (a NaN
// always means a bug upstream; write_wav refuses them too), std::runtime_error if libsndfile
// fails.
std::string wav_bytes(const float* samples, size_t count, int sample_rate);

}  // namespace omni::http
