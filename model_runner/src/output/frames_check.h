// Argument checks and pixel quantization shared by the frame writers (frames_writer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace omni::models::output {

// `frames` as a contiguous float32 CPU tensor [F, H, W, 3]; throws naming `who` ("write_png"),
// `path` and the problem when it is undefined, not 4-D with 3 channels last, empty along an axis
// or not floating point.
at::Tensor checked_frames(const at::Tensor& frames, const char* who, const std::string& path);

// round(clamp(x, 0, 1) * 255) as uint8 [F, H, W, 3] (torch.round: half to even, as numpy's);
// throws naming the first NaN or infinity by frame, row, column and channel. `first_frame`:
// the video's index of frames[0], when a writer quantizes a frame at a time.
at::Tensor quantize_rgb8(const at::Tensor& frames, const char* who, const std::string& path,
                         int64_t first_frame = 0);

}  // namespace omni::models::output
