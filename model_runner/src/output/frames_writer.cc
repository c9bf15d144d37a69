// write_frames (the writer by extension) and encode_mp4_bytes (write_mp4 through a temporary
// folder, for callers that send the video rather than keep it).
#include "model_runner/output/frames_writer.h"

#include <stdlib.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the system's temporary folder, removed with what it holds.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "omni-mp4-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      OMNI_THROW("encode_mp4_bytes: cannot create a folder like '", pattern,
                 "': ", std::strerror(errno));
    }
    path_ = pattern;
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  ~TempFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

std::string encode_mp4_bytes(const at::Tensor& frames, int64_t fps) {
  TempFolder folder;
  const std::string path = (folder.path() / "video.mp4").string();
  write_mp4(path, frames, fps);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  OMNI_CHECK(!in.bad() && !bytes.empty(), "encode_mp4_bytes: cannot read back '", path, "'");
  return bytes;
}

void write_frames(const std::string& path, const at::Tensor& frames, int64_t fps) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".mp4") return write_mp4(path, frames, fps);
  if (ext == ".png") return write_png(path, frames);
  if (ext == ".npy") return write_npy(path, frames);
  OMNI_THROW("cannot write frames to '", path, "': unknown extension '", ext,
             "' (.mp4 H.264 video, .png images, .npy NumPy array)");
}

}  // namespace omni::models
