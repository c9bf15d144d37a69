// Qwen2.5-VL's window attention layout (transformers' get_vision_window_index): each frame's
// merged patches are tiled by square windows of window_size / merge / patch merged patches a
// side (those on the last row and column cut short), and the tower runs on the patches
// reordered window by window, so that a window is a contiguous attention segment.
#pragma once

#include <cstdint>
#include <vector>

namespace omni::models::qwen2_5 {

struct VisionWindows {
  // Window order: the merged patch (its index in the processor's order) at each position.
  std::vector<int64_t> merged_order;
  // In patches of the window order: 0, then where each non-empty window ends (cu_window_seqlens).
  std::vector<int64_t> bounds;
};

// `grid` holds (t, h, w) per image, flattened, h and w multiples of `merge`;
// window_size >= merge * patch_size.
VisionWindows vision_windows(const std::vector<int64_t>& grid, int64_t merge, int64_t window_size,
                             int64_t patch_size);

}  // namespace omni::models::qwen2_5
