// Whisper log-mel features as transformers' WhisperFeatureExtractor computes them when torch is
// installed (_torch_extract_fbank_features, the path __call__ takes then): float32 STFT with a
// periodic Hann window, centred with reflect padding; power spectrum without the last frame;
// the float64 mel filter bank of audio_utils.mel_filter_bank cast to float32; log10 of the
// mel energies clamped at 1e-10; floor at (max - 8); then (x + 4) / 4.
#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/audio.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

// WhisperFeatureExtractor.__init__ passes max_frequency=8000.0 whatever the sampling rate.
constexpr double kMelMaxFrequency = 8000.0;

// audio_utils.hertz_to_mel / mel_to_hertz with mel_scale="slaney": linear below 1 kHz,
// logarithmic above.
constexpr double kMinLogHertz = 1000.0;
constexpr double kMinLogMel = 15.0;

double hertz_to_mel_slaney(double freq) {
  if (freq >= kMinLogHertz)
    return kMinLogMel + std::log(freq / kMinLogHertz) * (27.0 / std::log(6.4));
  return 3.0 * freq / 200.0;
}

double mel_to_hertz_slaney(double mel) {
  if (mel >= kMinLogMel)
    return kMinLogHertz * std::exp((std::log(6.4) / 27.0) * (mel - kMinLogMel));
  return 200.0 * mel / 3.0;
}

// numpy.linspace(start, stop, num) in float64, operation for operation: i * step + start, with
// the last point set to `stop`.
std::vector<double> linspace(double start, double stop, int64_t num) {
  std::vector<double> y(static_cast<size_t>(num));
  const double step = (stop - start) / static_cast<double>(num - 1);
  for (int64_t i = 0; i < num; ++i) y[i] = static_cast<double>(i) * step + start;
  if (num > 1) y[num - 1] = stop;
  return y;
}

void validate(const WhisperFeatureOptions& opt, const std::string& source) {
  OMNI_CHECK(opt.feature_size > 0, source, ": feature_size must be positive, got ",
             opt.feature_size);
  OMNI_CHECK(opt.sampling_rate > 0, source, ": sampling_rate must be positive, got ",
             opt.sampling_rate);
  OMNI_CHECK(opt.hop_length > 0, source, ": hop_length must be positive, got ", opt.hop_length);
  OMNI_CHECK(opt.n_fft >= 2, source, ": n_fft must be at least 2, got ", opt.n_fft);
}

}  // namespace

WhisperFeatureOptions whisper_options_from_preprocessor_config(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(dir_or_file, ec);
  const std::string file =
      is_dir ? (fs::path(dir_or_file) / "preprocessor_config.json").string() : dir_or_file;
  WhisperFeatureOptions opt;
  if (!fs::exists(file, ec)) {
    // A model directory without the file: Whisper's defaults for Qwen3-Omni. A file path that
    // does not exist is a typo, not a request for defaults.
    OMNI_CHECK(is_dir, "preprocessor config '", dir_or_file, "' does not exist");
    return opt;
  }
  const HfConfig cfg = HfConfig::load(file);
  if (cfg.has("feature_extractor_type")) {
    const std::string type = cfg.get_string("feature_extractor_type");
    OMNI_CHECK(type == "WhisperFeatureExtractor", file, ": feature_extractor_type is '", type,
               "', only WhisperFeatureExtractor is supported");
  }
  opt.feature_size = cfg.get_int("feature_size", opt.feature_size);
  opt.sampling_rate = cfg.get_int("sampling_rate", opt.sampling_rate);
  opt.hop_length = cfg.get_int("hop_length", opt.hop_length);
  opt.n_fft = cfg.get_int("n_fft", opt.n_fft);
  const double dither = cfg.get_double("dither", 0.0);
  OMNI_CHECK(dither == 0.0, file, ": dither is ", dither,
             "; dithering adds random noise to the audio, which this engine does not reproduce "
             "(set \"dither\": 0.0)");
  validate(opt, file);
  return opt;
}

at::Tensor whisper_mel_filter_bank(const WhisperFeatureOptions& opt) {
  validate(opt, "WhisperFeatureOptions");
  const int64_t n_freqs = opt.n_fft / 2 + 1;
  const int64_t n_mels = opt.feature_size;
  // Centre frequencies of the triangles, evenly spaced in mel; then the FFT bin frequencies
  // (linspace(0, sampling_rate // 2, n_freqs), an integer stop as in transformers).
  const std::vector<double> mel_freqs =
      linspace(hertz_to_mel_slaney(0.0), hertz_to_mel_slaney(kMelMaxFrequency), n_mels + 2);
  std::vector<double> filter_freqs(mel_freqs.size());
  for (size_t i = 0; i < mel_freqs.size(); ++i) filter_freqs[i] = mel_to_hertz_slaney(mel_freqs[i]);
  const std::vector<double> fft_freqs =
      linspace(0.0, static_cast<double>(opt.sampling_rate / 2), n_freqs);

  // _create_triangular_filter_bank, then slaney area normalisation (2 / band width).
  at::Tensor bank = at::empty({n_freqs, n_mels}, at::kDouble);
  double* out = bank.data_ptr<double>();
  for (int64_t f = 0; f < n_freqs; ++f) {
    for (int64_t m = 0; m < n_mels; ++m) {
      const double down =
          -(filter_freqs[m] - fft_freqs[f]) / (filter_freqs[m + 1] - filter_freqs[m]);
      const double up =
          (filter_freqs[m + 2] - fft_freqs[f]) / (filter_freqs[m + 2] - filter_freqs[m + 1]);
      const double weight = std::max(0.0, std::min(down, up));
      const double enorm = 2.0 / (filter_freqs[m + 2] - filter_freqs[m]);
      out[f * n_mels + m] = weight * enorm;
    }
  }
  return bank.to(at::kFloat);
}

at::Tensor whisper_log_mel(const AudioClip& clip, const WhisperFeatureOptions& opt) {
  validate(opt, "WhisperFeatureOptions");
  if (clip.sample_rate != opt.sampling_rate) {
    OMNI_THROW("audio is sampled at ", clip.sample_rate, " Hz but the feature extractor expects ",
               opt.sampling_rate,
               " Hz (preprocessor_config.json sampling_rate): resample it first with "
               "resample_audio(clip, ",
               opt.sampling_rate, ")");
  }
  const int64_t n = static_cast<int64_t>(clip.samples.size());
  const int64_t pad = opt.n_fft / 2;
  const int64_t n_frames = whisper_num_frames(n, opt);
  if (n <= pad || n_frames < 1) {
    OMNI_THROW("audio clip of ", n, " samples (", static_cast<double>(n) / opt.sampling_rate,
               " s) is too short for Whisper features: it needs more than n_fft / 2 = ", pad,
               " samples and at least hop_length = ", opt.hop_length, " samples");
  }

  // Read-only view of the samples: the centre padding below copies them before anything else
  // touches them.
  const at::Tensor wave =
      at::from_blob(const_cast<float*>(clip.samples.data()), {n}, at::TensorOptions(at::kFloat));
  const at::Tensor window = at::hann_window(opt.n_fft, /*periodic=*/true, at::kFloat);
  const at::Tensor stft =
      at::stft(wave, opt.n_fft, opt.hop_length, opt.n_fft, window, /*center=*/true, "reflect",
               /*normalized=*/false, /*onesided=*/true, /*return_complex=*/true);
  // [n_freqs, n_frames + 1] -> power spectrum without the last frame.
  const at::Tensor magnitudes = stft.slice(-1, 0, -1).abs().pow(2).contiguous();
  const at::Tensor mel_spec = at::matmul(whisper_mel_filter_bank(opt).t(), magnitudes);
  at::Tensor log_spec = at::clamp_min(mel_spec, 1e-10).log10();
  log_spec = at::maximum(log_spec, log_spec.max() - 8.0);
  log_spec = (log_spec + 4.0) / 4.0;
  OMNI_CHECK(log_spec.size(0) == opt.feature_size && log_spec.size(1) == n_frames,
             "whisper_log_mel: expected [", opt.feature_size, ", ", n_frames, "] features, got ",
             log_spec.sizes());
  return log_spec.contiguous();
}

}  // namespace omni::models
