// write_mp4 where FFmpeg's libraries were not found at configure time (the offline GPU machine,
// whose dependency bundle cannot hold FFmpeg's ~170 packages): MP4 output refuses with a message
// that says how to get it; PNG and NPY output still work.
#include "cpu_offload/check.h"
#include "model_runner/output/frames_writer.h"

namespace omni::models {

bool mp4_supported() { return false; }

void write_mp4(const std::string& path, const at::Tensor& /*frames*/, int64_t /*fps*/) {
  OMNI_THROW("cannot write MP4 '", path, "': this build has no MP4 output (FFmpeg's libraries ",
             "were not found when it was configured: scripts/setup.sh installs them); write ",
             ".png or .npy instead");
}

}  // namespace omni::models
