#include "qwen2_5/vision_windows.h"

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen2_5 {

VisionWindows vision_windows(const std::vector<int64_t>& grid, int64_t merge, int64_t window_size,
                             int64_t patch_size) {
  const int64_t side = window_size / merge / patch_size;  // in merged patches
  OMNI_CHECK(side > 0, "window_size ", window_size, " holds no merged patch of ",
             merge * patch_size, " pixels");
  const int64_t unit = merge * merge;
  VisionWindows out;
  out.bounds = {0};
  int64_t first = 0;  // index of the image's first merged patch
  for (size_t i = 0; i + 2 < grid.size(); i += 3) {
    const int64_t t = grid[i], rows = grid[i + 1] / merge, cols = grid[i + 2] / merge;
    // transformers pads the merged grid up to whole windows (a full extra row or column when it
    // divides evenly); the padding holds no patch, so empty windows add no bound.
    const int64_t window_rows = rows / side + 1, window_cols = cols / side + 1;
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t wr = 0; wr < window_rows; ++wr) {
        for (int64_t wc = 0; wc < window_cols; ++wc) {
          int64_t count = 0;
          for (int64_t r = wr * side; r < std::min(rows, (wr + 1) * side); ++r) {
            for (int64_t c = wc * side; c < std::min(cols, (wc + 1) * side); ++c) {
              out.merged_order.push_back(first + (f * rows + r) * cols + c);
              ++count;
            }
          }
          if (count > 0) out.bounds.push_back(out.bounds.back() + count * unit);
        }
      }
    }
    first += t * rows * cols;
  }
  return out;
}

}  // namespace omni::models::qwen2_5
