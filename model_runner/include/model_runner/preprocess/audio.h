// Audio inputs for the Qwen3-Omni thinker: decode a file (WAV/FLAC/OGG through libsndfile, the
// decoder python's soundfile uses, so the samples are bit-identical to
// `soundfile.read(path, dtype="float32")`), then compute Whisper log-mel features exactly as
// Hugging Face's WhisperFeatureExtractor does on its torch path (what the Qwen3-Omni processor
// runs: padding to the clip's own length, no truncation, no 30 s padding).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {

// Mono samples in [-1, 1) (PCM is scaled as soundfile does: int16 / 32768).
struct AudioClip {
  std::vector<float> samples;
  int64_t sample_rate = 0;
};

// What a file may declare before any sample is decoded: a header claiming 1 Hz, or hours, or a
// thousand channels, would make a few bytes cost gigabytes once decoded and resampled.
struct AudioLimits {
  int64_t min_sample_rate = 8000;
  int64_t max_sample_rate = 192000;
  double max_seconds = 0;  // 0: no limit
  // 7.1 audio; the models mix every input down to mono anyway.
  int64_t max_channels = 8;
};

// Decodes `path` (any format libsndfile reads: WAV, FLAC, OGG/Vorbis, ...). Multi-channel audio
// is mixed down by averaging the channels (librosa's mono=True). Throws omni::Error naming the
// file when it is missing, not audio libsndfile can decode, or holds no samples, and naming the
// limit when its sample rate or channel count is outside `limits` (checked on the header before
// any sample buffer exists) or it lasts longer (checked on the header's frame count before
// decoding, and again while decoding, for headers that do not say).
AudioClip read_audio_file(const std::string& path, const AudioLimits& limits = {});
// The same for a file's bytes in memory (an upload); `name` stands for the file in errors.
AudioClip decode_audio(const uint8_t* data, size_t size, const std::string& name,
                       const AudioLimits& limits = {});

// Resamples `clip` to `target_rate` Hz as librosa.load(path, sr=target_rate) does (what
// qwen_omni_utils runs): libsoxr at quality HQ with float32 samples, the calls python-soxr's
// soxr.resample(quality="HQ") makes, then the length fixed to ceil(n * target_rate /
// clip.sample_rate) (zeros appended, as librosa's fix_length does). A clip already at
// `target_rate` comes back unchanged. Throws omni::Error naming both rates when one is not
// positive or libsoxr fails.
AudioClip resample_audio(const AudioClip& clip, int64_t target_rate);

// The fields of a preprocessor_config.json that WhisperFeatureExtractor's features depend on.
struct WhisperFeatureOptions {
  int64_t feature_size = 128;  // mel bins
  int64_t sampling_rate = 16000;
  int64_t hop_length = 160;
  int64_t n_fft = 400;
};

// Reads feature_size, sampling_rate, hop_length and n_fft from `dir_or_file` (a
// preprocessor_config.json or a directory holding one); absent fields and a missing file give
// the defaults above. Throws when a field is invalid or "dither" is non-zero (dithering adds
// random noise, which a deterministic engine does not reproduce).
WhisperFeatureOptions whisper_options_from_preprocessor_config(const std::string& dir_or_file);

// Frames whisper_log_mel() returns for `num_samples` samples: num_samples / hop_length (the
// STFT's last frame is dropped). The thinker's feature_attention_mask.sum() for the clip.
inline int64_t whisper_num_frames(int64_t num_samples, const WhisperFeatureOptions& opt) {
  return num_samples / opt.hop_length;
}

// The slaney-normalised, slaney-scale mel filter bank of transformers' mel_filter_bank (0 Hz to
// 8 kHz, as WhisperFeatureExtractor sets it), computed in float64 and returned as float32
// [n_fft / 2 + 1, feature_size], the matrix the torch path multiplies with.
at::Tensor whisper_mel_filter_bank(const WhisperFeatureOptions& opt);

// Log-mel features of one clip: float32 [feature_size, whisper_num_frames(samples)], equal to
// WhisperFeatureExtractor(...)(samples, sampling_rate=..., padding=True, truncation=False,
// return_attention_mask=True)["input_features"][0]. The clip must be at the feature
// extractor's sampling rate (resample_audio() it first; no resampling here) and longer than
// n_fft / 2 samples (the STFT's reflect padding needs that).
at::Tensor whisper_log_mel(const AudioClip& clip, const WhisperFeatureOptions& opt);

}  // namespace omni::models
