// See frames_check.h.
#include "output/frames_check.h"

#include <ATen/ATen.h>

#include "cpu_offload/check.h"

namespace omni::models::output {

at::Tensor checked_frames(const at::Tensor& frames, const char* who, const std::string& path) {
  OMNI_CHECK(frames.defined(), who, " '", path, "': no frames (undefined tensor)");
  OMNI_CHECK(frames.dim() == 4 && frames.size(3) == 3, who, " '", path,
             "': frames must be [F, H, W, 3] (RGB, channels last), got ", frames.sizes());
  OMNI_CHECK(frames.size(0) > 0 && frames.size(1) > 0 && frames.size(2) > 0, who, " '", path,
             "': frames must not be empty, got ", frames.sizes());
  OMNI_CHECK(at::isFloatingType(frames.scalar_type()), who, " '", path,
             "': frames must be floating point (values in [0, 1]), got ", frames.scalar_type());
  return frames.detach().to(at::kCPU, at::kFloat).contiguous();
}

at::Tensor quantize_rgb8(const at::Tensor& frames, const char* who, const std::string& path,
                         int64_t first_frame) {
  if (!at::isfinite(frames).all().item<bool>()) {
    const at::Tensor bad = at::nonzero(at::logical_not(at::isfinite(frames)));
    const at::Tensor at_index = bad[0];
    const auto i = at_index.accessor<int64_t, 1>();
    OMNI_THROW(who, " '", path, "': frame ", first_frame + i[0], " row ", i[1], " column ", i[2],
               " channel ", i[3], " is ", frames[i[0]][i[1]][i[2]][i[3]].item<float>(), " (",
               bad.size(0), " non-finite values)");
  }
  // In float32, as numpy computes (x * 255).round() on a float32 array; in place on the one
  // copy clamp makes (a Wan2.1 clip is ~400 MB of float32).
  return frames.clamp(0.0, 1.0).mul_(255.0).round_().to(at::kByte).contiguous();
}

}  // namespace omni::models::output
