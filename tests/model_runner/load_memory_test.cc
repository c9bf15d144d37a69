// Host memory while loading a bf16 checkpoint of more than 1 GB (a synthetic Qwen3-Omni
// thinker): the peak resident set (VmHWM of /proc/self/status, reset before the load) stays
// within 1.05 x the file's bytes + 1 GiB above what the process held before, with the weights
// resident and with layerwise offload (host slabs + a sliding window on the simulated device);
// twice that when float32 is asked for (conversion on the way, unit by unit).
// The checkpoint is written once per process into the temp folder and removed at exit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cpu_offload/transfer_engine.h"
#include "model_runner/runner/synthetic_checkpoint.h"
#include "model_runner/runner/thinker_runner.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
size_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Resets VmHWM to the current resident set (Linux >= 4.0); false where that is not allowed.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

// ~1.1 GB in bf16: hidden 1024, 8 MoE layers of 64 experts (moe_intermediate 512), small
// encoders; the fixture's tokenizer.
qwen3_omni::ThinkerConfig config() {
  auto c = synthetic_thinker_config("small");
  auto& t = c.text;
  t.hidden_size = 1024;
  t.num_attention_heads = 16;
  t.num_key_value_heads = 4;
  t.head_dim = 64;
  t.intermediate_size = 2048;
  t.num_hidden_layers = 8;
  t.num_experts = 64;
  t.num_experts_per_tok = 4;
  t.moe_intermediate_size = 512;
  c.audio.output_dim = 1024;
  c.vision.out_hidden_size = 1024;
  return c;
}

class LoadMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        (fs::temp_directory_path() / ("omni_load_memory_" + std::to_string(::getpid()))).string();
    write_synthetic_checkpoint(dir_, config(), std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny",
                               at::kBFloat16);
    file_bytes_ = fs::file_size(fs::path(dir_) / "model.safetensors");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Loads the thinker with `options` and returns the peak resident growth during the load.
  size_t peak_growth(ThinkerRunnerOptions options, at::ScalarType expected = at::kBFloat16) {
    options.model_dir = dir_;
    if (!reset_peak_rss()) return 0;
    const size_t before = status_bytes("VmRSS");
    auto runner =
        ThinkerRunner::load(options, offload::make_transfer_engine(offload::DeviceKind::kCpuSim));
    const size_t peak = status_bytes("VmHWM");
    for (const auto& p : runner->model().parameters()) EXPECT_EQ(p.scalar_type(), expected);
    std::printf("file %.0f MB: RSS before %.0f MB, peak %.0f MB (+%.0f MB), after %.0f MB\n",
                file_bytes_ / 1e6, before / 1e6, peak / 1e6, (peak - before) / 1e6,
                status_bytes("VmRSS") / 1e6);
    return peak - before;
  }
  size_t bound() const { return static_cast<size_t>(1.05 * file_bytes_) + (size_t{1} << 30); }

  static std::string dir_;
  static size_t file_bytes_;
};
std::string LoadMemory::dir_;
size_t LoadMemory::file_bytes_ = 0;

TEST_F(LoadMemory, CheckpointIsOverOneGigabyte) { EXPECT_GT(file_bytes_, size_t{1} << 30); }

TEST_F(LoadMemory, ResidentInTheCheckpointDtype) {
  ThinkerRunnerOptions o;  // dtype auto: bf16 stays bf16
  const size_t growth = peak_growth(o);
  if (growth == 0) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak here";
  EXPECT_LE(growth, bound());
}

// float32 asked for: converted unit by unit on the way to the device. The weights take twice
// the file's bytes on the (simulated) device, but the host never holds a converted copy of the
// model beside them (which would make it 4x).
TEST_F(LoadMemory, ResidentConvertedToFloat32OnTheWay) {
  ThinkerRunnerOptions o;
  o.dtype = at::kFloat;
  const size_t growth = peak_growth(o, at::kFloat);
  if (growth == 0) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak here";
  EXPECT_LE(growth, 2 * bound());
}

TEST_F(LoadMemory, LayerwiseOffload) {
  ThinkerRunnerOptions o;
  o.offload.layerwise = true;
  const size_t growth = peak_growth(o);
  if (growth == 0) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak here";
  EXPECT_LE(growth, bound());
}

}  // namespace
}  // namespace omni::models
