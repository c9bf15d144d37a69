// WAV output through libsndfile. The data goes to a temporary file next to the target (same
// folder, so the final rename(2) stays on one filesystem and is atomic), is flushed and closed,
// and only then renamed over the target; every failure path removes the temporary file.
#include "model_runner/output/wav_writer.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sndfile.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using SndfileHandle = std::unique_ptr<SNDFILE, SndfileCloser>;

// Owns the temporary file until release(): the destructor closes and removes it, so an
// exception anywhere between creation and the rename leaves nothing behind.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the descriptor, reporting a failed close (NFS and full disks report errors there).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void release() { path_.clear(); }

 private:
  std::string path_;
  int fd_;
};

// A new file "<folder>/.<name>.tmp-<pid>-<random>" created with O_EXCL (never someone else's
// file) and mode 0666 minus the umask (what the target would get if written directly; mkstemp
// would make it 0600).
TempFile create_temp_next_to(const fs::path& target) {
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  int last_errno = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string name = "." + target.filename().string() + ".tmp-" +
                             std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                             std::to_string(device());
    const std::string path = (folder / name).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return TempFile(path, fd);
    last_errno = errno;
    if (last_errno != EEXIST) break;
  }
  OMNI_THROW("cannot write WAV '", target.string(), "': cannot create a file in '", folder.string(),
             "': ", std::strerror(last_errno));
}

int subtype_of(WavFormat format) {
  return format == WavFormat::kPcm16 ? SF_FORMAT_PCM_16 : SF_FORMAT_FLOAT;
}

}  // namespace

WavFormat parse_wav_format(const std::string& text) {
  if (text == "pcm16") return WavFormat::kPcm16;
  if (text == "f32") return WavFormat::kFloat32;
  OMNI_THROW("unknown WAV format '", text, "' (pcm16, f32)");
}

std::string to_string(WavFormat format) { return format == WavFormat::kPcm16 ? "pcm16" : "f32"; }

void write_wav(const std::string& path, const at::Tensor& samples, int64_t sample_rate,
               WavFormat format) {
  OMNI_CHECK(samples.defined(), "write_wav '", path, "': no samples (undefined tensor)");
  OMNI_CHECK(samples.dim() == 1, "write_wav '", path, "': samples must be 1-D [n], got ",
             samples.sizes());
  OMNI_CHECK(at::isFloatingType(samples.scalar_type()), "write_wav '", path,
             "': samples must be floating point, got ", samples.scalar_type());
  OMNI_CHECK(sample_rate > 0 && sample_rate <= INT_MAX, "write_wav '", path,
             "': sample rate must be positive, got ", sample_rate);
  at::Tensor data = samples.detach().to(at::kCPU, at::kFloat).contiguous();
  // Checked before any file exists: a NaN would become an arbitrary PCM value (or a float WAV
  // that players reject), and it always means a bug upstream.
  const at::Tensor bad = at::nonzero(at::logical_not(at::isfinite(data)));
  if (bad.numel() > 0) {
    const int64_t index = bad[0][0].item<int64_t>();
    OMNI_THROW("write_wav '", path, "': sample ", index, " of ", data.numel(), " is ",
               data[index].item<float>(), " (", bad.size(0), " non-finite samples)");
  }
  if (format == WavFormat::kPcm16) data = data.clamp(-1.0, 1.0);

  const fs::path target(path);
  OMNI_CHECK(!target.filename().empty(), "write_wav '", path, "': not a file name");
  TempFile temp = create_temp_next_to(target);
  {
    SF_INFO info{};
    info.samplerate = static_cast<int>(sample_rate);
    info.channels = 1;
    info.format = SF_FORMAT_WAV | subtype_of(format);
    // close_desc false: the descriptor stays ours, so that fsync and close can report errors.
    SndfileHandle file(sf_open_fd(temp.fd(), SFM_WRITE, &info, SF_FALSE));
    if (!file) {
      OMNI_THROW("cannot write WAV '", path, "': libsndfile: ", sf_strerror(nullptr));
    }
    const float* ptr = data.data_ptr<float>();
    const sf_count_t total = data.numel();
    constexpr sf_count_t kBlock = 1 << 16;
    for (sf_count_t done = 0; done < total;) {
      const sf_count_t n = std::min(kBlock, total - done);
      const sf_count_t written = sf_writef_float(file.get(), ptr + done, n);
      if (written != n) {
        OMNI_THROW("cannot write WAV '", path, "': wrote ", done + written, " of ", total,
                   " samples: ", sf_strerror(file.get()));
      }
      done += n;
    }
    // sf_close writes the final header sizes.
    const int err = sf_close(file.release());
    if (err != SF_ERR_NO_ERROR) {
      OMNI_THROW("cannot write WAV '", path, "': closing: ", sf_error_number(err));
    }
  }
  if (::fsync(temp.fd()) != 0 || temp.close() != 0) {
    OMNI_THROW("cannot write WAV '", path, "': ", std::strerror(errno));
  }
  if (std::rename(temp.path().c_str(), path.c_str()) != 0) {
    OMNI_THROW("cannot write WAV '", path, "': ", std::strerror(errno));
  }
  temp.release();
}

WavContents read_wav(const std::string& path, at::ScalarType dtype) {
  OMNI_CHECK(dtype == at::kFloat || dtype == at::kShort, "read_wav '", path,
             "': dtype must be float32 or int16, got ", dtype);
  SF_INFO info{};
  SndfileHandle file(sf_open(path.c_str(), SFM_READ, &info));
  if (!file) OMNI_THROW("cannot read sound file '", path, "': ", sf_strerror(nullptr));
  WavContents out;
  out.sample_rate = info.samplerate;
  out.channels = info.channels;
  out.format = info.format;
  out.samples = at::empty({static_cast<int64_t>(info.frames), info.channels},
                          at::TensorOptions().dtype(dtype));
  const sf_count_t read =
      dtype == at::kFloat
          ? sf_readf_float(file.get(), out.samples.data_ptr<float>(), info.frames)
          : sf_readf_short(file.get(), out.samples.data_ptr<int16_t>(), info.frames);
  OMNI_CHECK(read == info.frames, "sound file '", path, "': read ", read, " of ", info.frames,
             " frames: ", sf_strerror(file.get()));
  out.frames = read;
  return out;
}

}  // namespace omni::models
