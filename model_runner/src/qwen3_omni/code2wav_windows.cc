#include "model_runner/qwen3_omni/code2wav_windows.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {
namespace {

constexpr double kMaxLengthRatio = 1.5;

}  // namespace

std::vector<at::Tensor> decode_windows(Code2Wav& model, const std::vector<at::Tensor>& windows) {
  OMNI_CHECK(!windows.empty(), "decode_windows: no windows");
  if (windows.size() == 1) return {model.forward_validated(windows[0])};
  int64_t frames = 0;
  for (const auto& w : windows) frames = std::max(frames, w.size(1));
  std::vector<at::Tensor> rows;
  for (const auto& w : windows) {
    rows.push_back(at::constant_pad_nd(w.to(at::kLong), {0, frames - w.size(1)}));
  }
  const auto wav = model.forward_validated(at::stack(rows));
  // Every forward ends the same number of samples short of frames * samples_per_frame.
  const int64_t short_by = frames * model.samples_per_frame() - wav.size(-1);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < windows.size(); ++i) {
    const int64_t keep = windows[i].size(1) * model.samples_per_frame() - short_by;
    out.push_back(wav.narrow(0, static_cast<int64_t>(i), 1).narrow(-1, 0, keep).clone());
  }
  return out;
}

size_t windows_in_forward(const std::vector<int64_t>& sorted_lengths, int64_t max_windows) {
  if (sorted_lengths.empty()) return 0;
  const auto cap = static_cast<size_t>(std::max<int64_t>(1, max_windows));
  const auto shortest = static_cast<double>(sorted_lengths[0]);
  size_t n = 1;
  while (n < sorted_lengths.size() && n < cap &&
         static_cast<double>(sorted_lengths[n]) <= kMaxLengthRatio * shortest) {
    ++n;
  }
  return n;
}

}  // namespace omni::models::qwen3_omni
