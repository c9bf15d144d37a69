#include "model_runner/qwen2_5/rope_index.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen2_5 {

RopeIndex rope_index(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                     const std::vector<std::array<int64_t, 3>>& image_grid_thw,
                     const ImageTokenIds& tokens, int64_t spatial_merge_size) {
  OMNI_CHECK(input_ids.dim() == 2, "input_ids must be [batch, length], got ", input_ids.sizes());
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  const auto ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  at::Tensor mask;
  if (attention_mask.defined()) {
    OMNI_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask must be [", batch, ", ",
               length, "] as input_ids, got ", attention_mask.sizes());
    mask = attention_mask.to(at::kCPU).ne(0).contiguous();
  }
  const int64_t merge = spatial_merge_size;
  OMNI_CHECK(merge > 0, "spatial_merge_size must be positive, got ", merge);

  RopeIndex out;
  out.position_ids = at::zeros({3, batch, length}, at::kLong);
  out.rope_deltas = at::zeros({batch, 1}, at::kLong);
  auto positions = out.position_ids.accessor<int64_t, 3>();
  auto deltas = out.rope_deltas.accessor<int64_t, 2>();
  size_t image = 0;  // images are taken in order across the whole batch, as transformers does
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = ids.data_ptr<int64_t>() + b * length;
    // The row's tokens with the padding left out; positions number these.
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < length; ++i) {
      if (!mask.defined() || mask.data_ptr<bool>()[b * length + i]) kept.push_back(i);
    }
    OMNI_CHECK(!kept.empty(), "row ", b, " of the batch has no tokens");
    const int64_t count = static_cast<int64_t>(kept.size());
    int64_t next = 0, max_position = 0;
    auto place = [&](int64_t k, int64_t t, int64_t h, int64_t w) {
      positions[0][b][kept[k]] = t;
      positions[1][b][kept[k]] = h;
      positions[2][b][kept[k]] = w;
      max_position = std::max({max_position, t, h, w});
    };
    for (int64_t k = 0; k < count;) {
      const int64_t id = row[kept[k]];
      OMNI_CHECK(id != tokens.video_token_id, "token ", kept[k], " of row ", b,
                 " is a video token (", id, "): video input is not supported");
      if (id != tokens.image_token_id) {
        place(k++, next, next, next);
        ++next;
        continue;
      }
      OMNI_CHECK(image < image_grid_thw.size(), "the prompts hold more images (runs of image ",
                 "tokens) than the ", image_grid_thw.size(), " image grid(s) given");
      const auto [t, h, w] = image_grid_thw[image];
      OMNI_CHECK(t > 0 && h > 0 && w > 0 && h % merge == 0 && w % merge == 0, "image grid (", t,
                 ", ", h, ", ", w, ") of image ", image,
                 " must be positive with h and w multiples of spatial_merge_size ", merge);
      const int64_t rows = h / merge, cols = w / merge;
      int64_t run = 0;
      while (k + run < count && row[kept[k + run]] == tokens.image_token_id) ++run;
      OMNI_CHECK(run == t * rows * cols, "image ", image, " (grid ", t, " x ", h, " x ", w,
                 ") needs ", t * rows * cols, " image tokens, row ", b, " has a run of ", run);
      for (int64_t f = 0; f < t; ++f) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) place(k++, next + f, next + r, next + c);
        }
      }
      // transformers 5.24 advances by the spatial extent only, frames or not.
      next += std::max(rows, cols);
      ++image;
    }
    deltas[b][0] = max_position + 1 - count;
  }
  OMNI_CHECK(image == image_grid_thw.size(), image_grid_thw.size(),
             " image grid(s) given, the prompts hold ", image, " image(s)");
  return out;
}

}  // namespace omni::models::qwen2_5
