#include "model_runner/qwen3_omni/rope_index.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

RopePositions rope_positions(const ThinkerConfig& cfg, const std::vector<int64_t>& ids,
                             const std::vector<std::array<int64_t, 3>>& image_grids) {
  return rope_positions(rope_index_ids(cfg), ids, image_grids);
}

RopePositions rope_positions(const RopeIndexIds& cfg, const std::vector<int64_t>& ids,
                             const std::vector<std::array<int64_t, 3>>& image_grids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> t(n), h(n), w(n);
  const int64_t merge = cfg.spatial_merge_size;
  int64_t next = 0;  // position of the next sequential token
  size_t image = 0;
  for (int64_t i = 0; i < n;) {
    OMNI_CHECK(ids[i] != cfg.video_token_id, "prompt token ", i, " is a video token (", ids[i],
               "): video input is not supported yet");
    const bool image_start =
        ids[i] == cfg.image_token_id && (i == 0 || ids[i - 1] != cfg.image_token_id);
    if (!image_start) {
      t[i] = h[i] = w[i] = next++;
      ++i;
      continue;
    }
    OMNI_CHECK(image < image_grids.size(),
               "the prompt has more images (image token runs) than the ", image_grids.size(),
               " image(s) given");
    const auto [gt, gh, gw] = image_grids[image++];
    const int64_t rows = gh / merge, cols = gw / merge, count = gt * rows * cols;
    OMNI_CHECK(i + count <= n, "image ", image - 1, " needs ", count,
               " image tokens, the prompt ends before that");
    int64_t max_pos = next;
    for (int64_t f = 0; f < gt; ++f) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t k = i + (f * rows + r) * cols + c;
          OMNI_CHECK(ids[k] == cfg.image_token_id, "image ", image - 1, " needs ", count,
                     " consecutive image tokens, token ", k, " is ", ids[k]);
          t[k] = next + f * cfg.position_id_per_seconds;
          h[k] = next + r;
          w[k] = next + c;
          max_pos = std::max({max_pos, t[k], h[k], w[k]});
        }
      }
    }
    i += count;
    OMNI_CHECK(i >= n || ids[i] != cfg.image_token_id, "image ", image - 1, " has ", count,
               " tokens, the prompt has more");
    next = max_pos + 1;
  }
  OMNI_CHECK(image == image_grids.size(), image_grids.size(), " image(s) given, the prompt has ",
             image, " image token run(s)");
  RopePositions out;
  out.position_ids = at::empty({3, n}, at::kLong);
  auto* p = out.position_ids.data_ptr<int64_t>();
  std::copy(t.begin(), t.end(), p);
  std::copy(h.begin(), h.end(), p + n);
  std::copy(w.begin(), w.end(), p + 2 * n);
  out.rope_delta = next - n;
  return out;
}

}  // namespace omni::models::qwen3_omni
