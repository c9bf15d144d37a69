#include "model_runner/qwen3_omni/code2wav_stream.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
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

Code2WavStreamer::Code2WavStreamer(Code2Wav& model, Code2WavStreamOptions options, DecodeFn decode)
    : model_(model), options_(options), decode_(std::move(decode)) {
  options_.validate();
  if (!decode_) {
    decode_ = [&model](const at::Tensor& window) { return model.forward_validated(window); };
  }
}

int64_t Code2WavStreamer::buffered_frames() const {
  return buffer_.defined() ? buffer_.size(1) : 0;
}

int64_t Code2WavStreamer::next_chunk_frames() const {
  return stats_.chunks == 0 ? options_.first_chunk_frames : options_.chunk_frames;
}

at::Tensor Code2WavStreamer::decode(const at::Tensor& window, int64_t context) {
  const auto wav = decode_(window);  // push() checked the frames
  const int64_t length = wav.size(-1);
  const int64_t drop = std::min(context * model_.samples_per_frame(), length);
  auto samples = wav.narrow(-1, drop, length - drop).reshape({-1}).to(at::kCPU, at::kFloat);
  stats_.frames_decoded += window.size(1);
  stats_.frames_emitted += window.size(1) - context;
  stats_.chunks += 1;
  stats_.samples += samples.numel();
  return samples.contiguous();
}

at::Tensor Code2WavStreamer::push(const at::Tensor& frames) {
  OMNI_CHECK(!finished_, "code2wav stream: push() after finish(); call reset() to start anew");
  validate_codes(model_.config(), frames, stats_.frames_received);
  OMNI_CHECK(frames.size(1) >= 1, "code2wav stream: push() needs at least one frame, got [",
             frames.size(0), ", ", frames.size(1), "]");
  const at::Tensor incoming =
      frames.to(buffer_.defined() ? buffer_.device() : frames.device(), at::kLong);
  const at::Tensor all = buffer_.defined() ? at::cat({buffer_, incoming}, 1) : incoming;
  stats_.frames_received += frames.size(1);

  // `all` = [context | pending]; decode every complete chunk with its context in front.
  std::vector<at::Tensor> out;
  int64_t offset = 0, context = context_;
  int64_t pending = all.size(1) - context;
  for (int64_t need = next_chunk_frames(); pending >= need; need = next_chunk_frames()) {
    out.push_back(decode(all.narrow(1, offset, context + need), context));
    const int64_t end = offset + context + need;
    context = std::min(options_.left_context_frames, context + need);
    offset = end - context;
    pending -= need;
  }
  // Keep only what a future chunk can need: its left context and the pending frames.
  buffer_ = all.narrow(1, offset, all.size(1) - offset).clone();
  context_ = context;
  stats_.max_buffered_frames = std::max(stats_.max_buffered_frames, buffered_frames());
  return concat(out);
}

at::Tensor Code2WavStreamer::finish() {
  if (finished_) return empty_samples();
  finished_ = true;
  at::Tensor out = empty_samples();
  if (pending_frames() > 0) out = decode(buffer_, context_);
  buffer_ = at::Tensor();
  context_ = 0;
  return out;
}

void Code2WavStreamer::reset() {
  buffer_ = at::Tensor();
  context_ = 0;
  finished_ = false;
  stats_ = Code2WavStreamStats{};
}

}  // namespace omni::models::qwen3_omni
