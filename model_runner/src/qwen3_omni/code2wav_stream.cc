#include "model_runner/qwen3_omni/code2wav_stream.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {
namespace {

at::Tensor empty_samples() { return at::empty({0}, at::TensorOptions(at::kFloat)); }

at::Tensor concat(const std::vector<at::Tensor>& parts) {
  if (parts.empty()) return empty_samples();
  if (parts.size() == 1) return parts[0];
  return at::cat(parts, 0);
}

}  // namespace

void Code2WavStreamOptions::validate() const {
  if (first_chunk_frames < 1) {
    OMNI_THROW("code2wav stream: first_chunk_frames must be >= 1, got ", first_chunk_frames);
  }
  if (chunk_frames < 1) {
    OMNI_THROW("code2wav stream: chunk_frames must be >= 1, got ", chunk_frames);
  }
  if (left_context_frames < 0) {
    OMNI_THROW("code2wav stream: left_context_frames must be >= 0, got ", left_context_frames);
  }
}

Code2WavStreamer::Code2WavStreamer(Code2Wav& model, Code2WavStreamOptions options)
    : model_(model), options_(options) {
  options_.validate();
}

int64_t Code2WavStreamer::buffered_frames() const {
  return buffer_.defined() ? buffer_.size(1) : 0;
}

int64_t Code2WavStreamer::next_chunk_frames() const {
  return stats_.chunks == 0 ? options_.first_chunk_frames : options_.chunk_frames;
}

int64_t Code2WavStreamer::due_frames(bool last) const {
  const int64_t pending = pending_frames();
  if (pending >= next_chunk_frames()) return next_chunk_frames();
  return last ? pending : 0;
}

void Code2WavStreamer::append(const at::Tensor& frames) {
  OMNI_CHECK(!finished_, "code2wav stream: push() after finish(); call reset() to start anew");
  validate_codes(model_.config(), frames, stats_.frames_received);
  OMNI_CHECK(frames.size(1) >= 1, "code2wav stream: push() needs at least one frame, got [",
             frames.size(0), ", ", frames.size(1), "]");
  const at::Tensor incoming =
      frames.to(buffer_.defined() ? buffer_.device() : frames.device(), at::kLong);
  // A new tensor: the storage of the frames already decoded goes with the old one.
  buffer_ = buffer_.defined() ? at::cat({buffer_, incoming}, 1) : incoming.clone();
  stats_.frames_received += frames.size(1);
  // Retained "between two calls": what stays once the chunks now due are decoded.
  if (due_frames(false) == 0) note_buffered();
}

void Code2WavStreamer::note_buffered() {
  stats_.max_buffered_frames = std::max(stats_.max_buffered_frames, buffered_frames());
}

at::Tensor Code2WavStreamer::next_window(bool last) const {
  const int64_t due = due_frames(last);
  return due > 0 ? buffer_.narrow(1, 0, context_ + due) : at::Tensor();
}

at::Tensor Code2WavStreamer::accept(const at::Tensor& wav, bool last) {
  const int64_t due = due_frames(last);
  OMNI_CHECK(due > 0, "code2wav stream: accept() with no window due");
  const int64_t length = wav.size(-1);
  const int64_t drop = std::min(context_ * model_.samples_per_frame(), length);
  auto samples = wav.narrow(-1, drop, length - drop).reshape({-1}).to(at::kCPU, at::kFloat);
  stats_.frames_decoded += context_ + due;
  stats_.frames_emitted += due;
  stats_.chunks += 1;
  stats_.samples += samples.numel();
  // Keep only what a future chunk can need: its left context and the pending frames.
  const int64_t context = std::min(options_.left_context_frames, context_ + due);
  const int64_t offset = context_ + due - context;
  buffer_ = buffer_.narrow(1, offset, buffer_.size(1) - offset);
  context_ = context;
  if (due_frames(last) == 0) note_buffered();
  return samples.contiguous();
}

at::Tensor Code2WavStreamer::push(const at::Tensor& frames) {
  append(frames);
  std::vector<at::Tensor> out;
  for (auto window = next_window(false); window.defined(); window = next_window(false)) {
    out.push_back(accept(model_.forward_validated(window), false));  // append() checked them
  }
  return concat(out);
}

at::Tensor Code2WavStreamer::finish() {
  if (finished_) return empty_samples();
  std::vector<at::Tensor> out;
  for (auto window = next_window(true); window.defined(); window = next_window(true)) {
    out.push_back(accept(model_.forward_validated(window), true));
  }
  finished_ = true;
  buffer_ = at::Tensor();
  context_ = 0;
  return concat(out);
}

void Code2WavStreamer::reset() {
  buffer_ = at::Tensor();
  context_ = 0;
  finished_ = false;
  stats_ = Code2WavStreamStats{};
}

}  // namespace omni::models::qwen3_omni
