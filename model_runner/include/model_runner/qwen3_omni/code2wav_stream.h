// Streaming code2wav: decodes codec frames into audio as the talker produces them.
//
// Frames are cut into chunks: the first of `first_chunk_frames` (small, for a short time to
// first audio), then `chunk_frames` each. A chunk is decoded as soon as all its frames have
// arrived, with up to `left_context_frames` frames before it in front; the samples of those
// context frames (context * samples_per_frame) are dropped. finish() decodes the last, possibly
// partial, chunk.
//
// What it equals: the concatenated output is exactly the reference's chunked decode with the
// same chunk schedule (Qwen3OmniMoeCode2Wav.chunked_decode when first == chunk, and
// stream_decode in tests/fixtures/make_qwen3_omni_fixture.py otherwise), whatever the pieces
// push() is fed in. It is NOT equal to one forward over all frames: every forward loses 555
// samples at its end (the causal transposed convolutions of the decoder trim one step each), so
// each chunk is 555 samples short of chunk * samples_per_frame, and the left context bounds the
// receptive field the chunk sees (one forward sees everything before it).
//
// Cost: only the codes a future chunk can still need are kept (its left context and the frames
// not yet decoded), so a long answer never re-decodes from its start: each chunk decodes at most
// left_context + chunk frames, and the work per frame stays flat. stats() counts it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "model_runner/qwen3_omni/code2wav.h"

namespace omni::models::qwen3_omni {

struct Code2WavStreamOptions {
  int64_t first_chunk_frames = 4;    // >= 1
  int64_t chunk_frames = 25;         // >= 1
  int64_t left_context_frames = 25;  // >= 0

  // Throws omni::Error naming the field when a value is out of range.
  void validate() const;
};

struct Code2WavStreamStats {
  int64_t frames_received = 0;      // pushed so far
  int64_t frames_emitted = 0;       // frames whose samples were returned
  int64_t frames_decoded = 0;       // frames run through code2wav, left context included
  int64_t chunks = 0;               // code2wav forwards
  int64_t samples = 0;              // samples returned
  int64_t max_buffered_frames = 0;  // most code frames retained between two calls
};

class Code2WavStreamer {
 public:
  // `model` must outlive the streamer. Throws on invalid options.
  explicit Code2WavStreamer(Code2Wav& model, Code2WavStreamOptions options = {});

  // frames [num_quantizers, n] (integer, n >= 1, any device). Returns the samples (float32,
  // CPU, [k], possibly k = 0) of every chunk that became complete, in order. Throws after
  // finish() (until reset()), and on a malformed or out-of-range frame (naming it).
  at::Tensor push(const at::Tensor& frames);
  // Decodes the frames still pending (a partial last chunk) and returns their samples (empty
  // when none are pending). The stream then takes no more frames until reset().
  at::Tensor finish();

  // push() in steps, for a caller that decodes the windows itself (a serving stage decodes
  // those of several requests in one forward). append() takes frames as push() does, without
  // decoding; next_window() is the next window to decode: a complete chunk with its left
  // context in front, or with `last` (no more frames will come) also the partial last chunk;
  // undefined when none is due. accept() takes its decoded samples (forward_validated's output)
  // and returns the chunk's, as push() would have.
  void append(const at::Tensor& frames);
  at::Tensor next_window(bool last) const;
  at::Tensor accept(const at::Tensor& wav, bool last);
  // Starts a new stream: drops every frame and zeroes the stats.
  void reset();

  // Frames retained now: the left context of the next chunk + the frames not yet decoded.
  int64_t buffered_frames() const;
  // Frames received but not yet decoded.
  int64_t pending_frames() const { return buffered_frames() - context_; }
  bool finished() const { return finished_; }
  const Code2WavStreamStats& stats() const { return stats_; }
  const Code2WavStreamOptions& options() const { return options_; }

 private:
  int64_t next_chunk_frames() const;
  // Frames of the chunk next_window(last) holds after its context (0: none is due).
  int64_t due_frames(bool last) const;
  void note_buffered();  // max_buffered_frames

  Code2Wav& model_;
  Code2WavStreamOptions options_;
  at::Tensor buffer_;    // [num_quantizers, context_ + pending] int64, or undefined
  int64_t context_ = 0;  // frames at the front of buffer_ already emitted
  bool finished_ = false;
  Code2WavStreamStats stats_;
};

}  // namespace omni::models::qwen3_omni
