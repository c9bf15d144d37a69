// Sample-rate conversion through libsoxr, called the way librosa.load(path, sr=...) calls it
// (librosa.resample(res_type="soxr_hq") -> python-soxr's soxr.resample(quality="HQ")):
//   * soxr_create(in, out, 1 channel) with soxr_quality_spec(SOXR_HQ, 0), float32 in and out
//     (python-soxr's split-channel float32 for a 1-D array; with one channel that is the same
//     buffer layout as interleaved) and the default runtime spec;
//   * the input fed in blocks of max(1000, 48000 * in / out) samples into an output buffer of
//     (size_t)(n * out / in) + 1 samples, then one flushing soxr_process(NULL, 0);
//   * librosa's fix_length: the output zero-padded or trimmed to ceil(n * (out / in)).
#include <soxr.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/audio.h"

namespace omni::models {
namespace {

struct SoxrDeleter {
  void operator()(soxr_t s) const { soxr_delete(s); }
};
using SoxrHandle = std::unique_ptr<struct soxr, SoxrDeleter>;

}  // namespace

AudioClip resample_audio(const AudioClip& clip, int64_t target_rate) {
  OMNI_CHECK(clip.sample_rate > 0, "resample_audio: the clip's sample rate must be positive, got ",
             clip.sample_rate, " Hz (target ", target_rate, " Hz)");
  OMNI_CHECK(target_rate > 0, "resample_audio: the target sample rate must be positive, got ",
             target_rate, " Hz (clip at ", clip.sample_rate, " Hz)");
  if (clip.sample_rate == target_rate) return clip;

  const double in_rate = static_cast<double>(clip.sample_rate);
  const double out_rate = static_cast<double>(target_rate);
  const size_t ilen = clip.samples.size();
  // python-soxr's output buffer and block size (soxr_ext.cpp, csoxr_split_ch).
  const auto olen = static_cast<size_t>(static_cast<double>(ilen) * out_rate / in_rate + 1);
  const auto div_len = static_cast<size_t>(std::max(1000.0, 48000.0 * in_rate / out_rate));

  soxr_error_t err = nullptr;
  const soxr_io_spec_t io_spec = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality_spec = soxr_quality_spec(SOXR_HQ, 0);
  SoxrHandle soxr(soxr_create(in_rate, out_rate, 1, &err, &io_spec, &quality_spec, nullptr));
  OMNI_CHECK(err == nullptr && soxr != nullptr, "resample_audio: libsoxr cannot resample from ",
             clip.sample_rate, " Hz to ", target_rate, " Hz: ", err ? err : "soxr_create failed");

  std::vector<float> out(olen, 0.0f);
  size_t out_pos = 0;
  size_t odone = 0;
  for (size_t idx = 0; idx < ilen; idx += div_len) {
    err = soxr_process(soxr.get(), clip.samples.data() + idx, std::min(div_len, ilen - idx),
                       nullptr, out.data() + out_pos, olen - out_pos, &odone);
    OMNI_CHECK(err == nullptr, "resample_audio: libsoxr failed resampling from ", clip.sample_rate,
               " Hz to ", target_rate, " Hz: ", err);
    out_pos += odone;
  }
  err = soxr_process(soxr.get(), nullptr, 0, nullptr, out.data() + out_pos, olen - out_pos, &odone);
  OMNI_CHECK(err == nullptr, "resample_audio: libsoxr failed flushing the resampler from ",
             clip.sample_rate, " Hz to ", target_rate, " Hz: ", err);
  out_pos += odone;

  // librosa.resample: n_samples = int(np.ceil(len * ratio)) with ratio = target / orig, then
  // util.fix_length (zeros appended, or the tail cut).
  const double ratio = out_rate / in_rate;
  const auto n_samples = static_cast<size_t>(std::ceil(static_cast<double>(ilen) * ratio));
  out.resize(out_pos);
  out.resize(n_samples, 0.0f);

  AudioClip result;
  result.samples = std::move(out);
  result.sample_rate = target_rate;
  return result;
}

}  // namespace omni::models
