// Several requests' code2wav windows decoded in one forward (a serving stage's batch): the
// windows are padded on the right with code 0 to the longest; code2wav is causal, so each row
// keeps exactly the samples of its own frames.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model_runner/qwen3_omni/code2wav.h"

namespace omni::models::qwen3_omni {

// Checked windows [num_quantizers, T_i] -> for each, Code2Wav::forward_validated(window)'s
// samples [1, 1, T_i * samples_per_frame - 555] (within rounding: the batch's convolutions may
// block the work differently). One window runs alone, unpadded.
std::vector<at::Tensor> decode_windows(Code2Wav& model, const std::vector<at::Tensor>& windows);

// How many of the windows of `sorted_lengths` (frames, shortest first) one forward takes: the
// shortest and those at most 1.5 times its length (the padding then costs at most half the
// work), at most `max_windows` (>= 1). The longer ones go in a later forward, so that a short
// window (a first chunk: a request's first audio) does not wait for them.
size_t windows_in_forward(const std::vector<int64_t>& sorted_lengths, int64_t max_windows);

}  // namespace omni::models::qwen3_omni
