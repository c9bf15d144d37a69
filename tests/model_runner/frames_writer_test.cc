// write_npy / write_png / write_mp4 / write_frames: .npy files byte for byte as numpy.save
// writes them (checked by numpy itself when python3 has it), PNG pixels read back through the
// project's decoder, MP4 streams as ffprobe and ffmpeg see them, and no file (target or
// temporary) after a failure.
#include "model_runner/output/frames_writer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "model_runner/preprocess/image.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_bytes;
using testing::write_bytes;

// Runs `command` through the shell; its stdout, and its exit status in `status`.
std::string run(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *status = ::pclose(pipe);
  return out;
}

bool have(const std::string& command) {
  int status = 0;
  run(command + " >/dev/null 2>&1", &status);
  return status == 0;
}

// `stem` with each extension write_frames takes, less .mp4 where this build has no MP4 output.
std::vector<std::string> each_format(const std::string& stem) {
  std::vector<std::string> names = {stem + ".npy", stem + ".png"};
  if (mp4_supported()) names.push_back(stem + ".mp4");
  return names;
}

class FramesWriterTest : public testing::TempDirTest {
 protected:
  // Names in the test directory, so a leftover temporary file shows.
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir())) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }
};

// Random values in [lo, hi), fixed seed.
at::Tensor random_frames(int64_t f, int64_t h, int64_t w, double lo = 0.0, double hi = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  return at::empty({f, h, w, 3}, at::kFloat).uniform_(lo, hi, gen);
}

// A smooth picture moving over time: what H.264 at crf 18 keeps within a few levels.
at::Tensor gradient_frames(int64_t f, int64_t h, int64_t w) {
  const auto t = at::arange(f, at::kFloat).view({f, 1, 1, 1});
  const auto y = at::arange(h, at::kFloat).view({1, h, 1, 1});
  const auto x = at::arange(w, at::kFloat).view({1, 1, w, 1});
  const auto c = at::arange(3, at::kFloat).view({1, 1, 1, 3});
  return (0.5 + 0.35 * at::sin(x / w * 3.0 + y / h * 2.0 + c * 1.5 + t * 0.2)).contiguous();
}

std::string raw_bytes(const at::Tensor& t) {
  const auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// What write_png / write_mp4 store for frame `i`: round(clamp(x, 0, 1) * 255), half to even.
std::vector<uint8_t> expected_rgb8(const at::Tensor& frames, int64_t i) {
  const auto f = frames[i].contiguous();
  const float* p = f.data_ptr<float>();
  std::vector<uint8_t> out(static_cast<size_t>(f.numel()));
  for (size_t k = 0; k < out.size(); ++k) {
    out[k] = static_cast<uint8_t>(std::nearbyint(std::clamp(p[k], 0.0f, 1.0f) * 255.0f));
  }
  return out;
}

// ------------------------------------------------------------------------------------- NPY

TEST_F(FramesWriterTest, NpyHeaderIsNumpysFormat10) {
  const at::Tensor frames = random_frames(2, 3, 4);
  write_npy(path("a.npy"), frames);
  const std::string bytes = read_bytes(path("a.npy"));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4, 3), }";
  // numpy: 21 - len("2") spare spaces for the first axis, then spaces to a multiple of 64
  // bytes in all (magic 6 + version 2 + length 2 + header), the last one '\n'.
  std::string header = dict + std::string(20, ' ');
  header += std::string(64 - (10 + header.size() + 1) % 64, ' ') + "\n";
  ASSERT_EQ(header.size(), 118u);
  const std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header;
  ASSERT_EQ(bytes.size(), 128u + 2 * 3 * 4 * 3 * 4);
  EXPECT_EQ(bytes.substr(0, 128), expected);
  EXPECT_EQ(bytes.substr(128), raw_bytes(frames));
  EXPECT_EQ(listing(), (std::set<std::string>{"a.npy"}));
}

TEST_F(FramesWriterTest, NpyEqualsNumpySaveBitForBit) {
  if (!have("python3 -c 'import numpy'")) GTEST_SKIP() << "python3 with numpy not available";
  // Shapes whose headers pad differently, a first axis of 5 digits, and values numpy must keep
  // bit for bit: NaN, infinities, -0, subnormals, out-of-range.
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 4, 3}, {1, 1, 1, 3}, {81, 6, 10, 3}, {12345, 1, 1, 3}, {3, 480, 2, 3}};
  std::string script = "import numpy as np, io, sys\nok = True\n";
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto& shape = shapes[s];
    at::Tensor frames = random_frames(shape[0], shape[1], shape[2], -0.5, 1.5);
    auto flat = frames.view({-1});
    flat[0] = std::numeric_limits<float>::quiet_NaN();
    flat[1] = -0.0f;
    flat[2] = std::numeric_limits<float>::infinity();
    if (flat.numel() > 3) flat[3] = std::numeric_limits<float>::denorm_min();
    const std::string npy = path("f" + std::to_string(s) + ".npy");
    const std::string raw = path("f" + std::to_string(s) + ".raw");
    write_npy(npy, frames);
    write_bytes(raw, raw_bytes(frames));
    script += "a = np.load('" + npy + "')\n";
    script += "b = np.fromfile('" + raw + "', '<f4').reshape((" + std::to_string(shape[0]) + "," +
              std::to_string(shape[1]) + "," + std::to_string(shape[2]) + ",3))\n";
    script += "buf = io.BytesIO(); np.save(buf, b)\n";
    script +=
        "good = a.dtype == np.dtype('<f4') and a.shape == b.shape and "
        "a.flags.c_contiguous and np.array_equal(a.view('<u4'), b.view('<u4')) and "
        "buf.getvalue() == open('" +
        npy + "', 'rb').read()\n";
    script += "print('" + std::to_string(s) + "', good); ok = ok and good\n";
  }
  script += "sys.exit(0 if ok else 1)\n";
  write_bytes(path("check.py"), script);
  int status = 0;
  const std::string out = run("python3 " + path("check.py") + " 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
}

// ------------------------------------------------------------------------------------- PNG

TEST_F(FramesWriterTest, PngOneFrameReadsBackRounded) {
  at::Tensor frames = random_frames(1, 5, 7, -0.2, 1.2);  // out-of-range values clamp
  auto flat = frames.view({-1});
  flat[0] = 0.0f;
  flat[1] = 1.0f;
  flat[2] = 0.5f;  // 127.5 -> 128 (half to even)
  flat[3] = 1.5f / 255.0f;
  write_png(path("one.png"), frames);
  EXPECT_EQ(listing(), (std::set<std::string>{"one.png"}));
  const RgbImage image = read_image_file(path("one.png"));
  EXPECT_EQ(image.height, 5);
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.pixels, expected_rgb8(frames, 0));
  EXPECT_EQ(image.pixels[2], 128);
}

TEST_F(FramesWriterTest, PngSeveralFramesGoToNumberedFiles) {
  const at::Tensor frames = random_frames(3, 4, 6).to(at::kDouble);  // other float dtypes too
  write_png(path("clip.png"), frames);
  EXPECT_EQ(listing(), (std::set<std::string>{"clip_0000.png", "clip_0001.png", "clip_0002.png"}));
  const at::Tensor as_float = frames.to(at::kFloat);
  for (int64_t i = 0; i < 3; ++i) {
    const RgbImage image = read_image_file(png_frame_paths(path("clip.png"), 3)[i]);
    EXPECT_EQ(image.pixels, expected_rgb8(as_float, i)) << "frame " << i;
  }
  EXPECT_EQ(png_frame_paths("out/x.png", 1), (std::vector<std::string>{"out/x.png"}));
  const auto many = png_frame_paths("out/x.png", 10001);
  EXPECT_EQ(many.front(), "out/x_00000.png");
  EXPECT_EQ(many.back(), "out/x_10000.png");
}

TEST_F(FramesWriterTest, PngBytesAreTheFilesWritePngWrites) {
  const at::Tensor frames = random_frames(2, 4, 6);
  const std::vector<std::string> pngs = encode_png_bytes(frames);
  write_png(path("two.png"), frames);
  ASSERT_EQ(pngs.size(), 2u);
  for (size_t i = 0; i < pngs.size(); ++i) {
    EXPECT_EQ(pngs[i], read_bytes(png_frame_paths(path("two.png"), 2)[i])) << "frame " << i;
  }
  const at::Tensor bad = at::full({1, 2, 2, 3}, std::nanf(""));
  EXPECT_NE(error_of([&] { encode_png_bytes(bad); }).find("encode_png_bytes"), std::string::npos);
}

TEST_F(FramesWriterTest, PngFailureOnALaterFrameLeavesNoFile) {
  // The third file's name is a directory: its rename fails after the first two were renamed,
  // which must then be removed again.
  fs::create_directory(path("clip_0002.png"));
  const std::string error = error_of([&] { write_png(path("clip.png"), random_frames(4, 2, 2)); });
  EXPECT_NE(error.find("clip_0002.png"), std::string::npos) << error;
  EXPECT_EQ(listing(), (std::set<std::string>{"clip_0002.png"}));
}

TEST_F(FramesWriterTest, NonFiniteValuesAreRefusedForPixels) {
  at::Tensor frames = random_frames(2, 2, 2);
  frames[1][0][1][2] = std::numeric_limits<float>::quiet_NaN();
  for (const std::string& name : each_format("n")) {
    if (name == "n.npy") continue;  // NaN is a value .npy keeps
    const std::string error = error_of([&] { write_frames(path(name), frames, 16); });
    EXPECT_NE(error.find("frame 1 row 0 column 1 channel 2 is nan"), std::string::npos) << error;
  }
  EXPECT_TRUE(listing().empty());
}

// ------------------------------------------------------------------------------------- MP4

struct Probe {
  std::string json;
  bool has(const std::string& part) const { return json.find(part) != std::string::npos; }
};

Probe ffprobe(const std::string& file) {
  int status = 0;
  Probe p{
      run("ffprobe -v error -select_streams v:0 -count_frames -show_entries "
          "stream=codec_name,width,height,r_frame_rate,nb_read_frames,pix_fmt -of json '" +
              file + "'",
          &status)};
  EXPECT_EQ(status, 0) << p.json;
  return p;
}

TEST_F(FramesWriterTest, Mp4IsH264AtTheFrameRateAndDecodesCloseToTheInput) {
  if (!mp4_supported()) GTEST_SKIP() << "built without FFmpeg: no MP4 output";
  if (!have("ffprobe -version") || !have("ffmpeg -version")) GTEST_SKIP() << "no ffprobe/ffmpeg";
  const int64_t f = 17, h = 48, w = 64;
  const at::Tensor frames = gradient_frames(f, h, w);
  write_mp4(path("v.mp4"), frames, 16);
  EXPECT_EQ(listing(), (std::set<std::string>{"v.mp4"}));
  const Probe probe = ffprobe(path("v.mp4"));
  EXPECT_TRUE(probe.has("\"codec_name\": \"h264\"")) << probe.json;
  EXPECT_TRUE(probe.has("\"width\": 64")) << probe.json;
  EXPECT_TRUE(probe.has("\"height\": 48")) << probe.json;
  EXPECT_TRUE(probe.has("\"pix_fmt\": \"yuv420p\"")) << probe.json;
  EXPECT_TRUE(probe.has("\"r_frame_rate\": \"16/1\"")) << probe.json;
  EXPECT_TRUE(probe.has("\"nb_read_frames\": \"17\"")) << probe.json;

  int status = 0;
  const std::string rgb =
      run("ffmpeg -v error -i '" + path("v.mp4") + "' -f rawvideo -pix_fmt rgb24 - 2>/dev/null",
          &status);
  ASSERT_EQ(status, 0);
  ASSERT_EQ(rgb.size(), static_cast<size_t>(f * h * w * 3));
  double total = 0;
  for (int64_t i = 0; i < f; ++i) {
    const auto want = expected_rgb8(frames, i);
    for (size_t k = 0; k < want.size(); ++k) {
      total += std::abs(static_cast<int>(static_cast<uint8_t>(rgb[i * want.size() + k])) -
                        static_cast<int>(want[k]));
    }
  }
  const double mean_error = total / static_cast<double>(rgb.size());
  EXPECT_LT(mean_error, 3.0) << "mean absolute error in 8-bit levels";
}

TEST_F(FramesWriterTest, Mp4BytesAreFaststartAndMatchTheFileWriter) {
  if (!mp4_supported()) GTEST_SKIP() << "built without FFmpeg: no MP4 output";
  if (!have("ffprobe -version")) GTEST_SKIP() << "no ffprobe";
  const at::Tensor frames = gradient_frames(5, 32, 32);
  const std::string bytes = encode_mp4_bytes(frames, 24);
  ASSERT_GT(bytes.size(), 16u);
  EXPECT_EQ(bytes.substr(4, 4), "ftyp");
  // +faststart: the index (moov) before the data (mdat).
  ASSERT_NE(bytes.find("moov"), std::string::npos);
  EXPECT_LT(bytes.find("moov"), bytes.find("mdat"));
  write_bytes(path("b.mp4"), bytes);
  const Probe probe = ffprobe(path("b.mp4"));
  EXPECT_TRUE(probe.has("\"r_frame_rate\": \"24/1\"")) << probe.json;
  EXPECT_TRUE(probe.has("\"nb_read_frames\": \"5\"")) << probe.json;
  write_mp4(path("a.mp4"), frames, 24);
  EXPECT_EQ(read_bytes(path("a.mp4")).size(), bytes.size());  // same encoder, same settings
}

TEST_F(FramesWriterTest, Mp4OddSizesAndBadRatesAreRefused) {
  if (!mp4_supported()) GTEST_SKIP() << "built without FFmpeg: no MP4 output";
  std::string error = error_of([&] { write_mp4(path("o.mp4"), random_frames(2, 48, 65), 16); });
  EXPECT_NE(error.find("65x48"), std::string::npos) << error;
  EXPECT_NE(error.find("even"), std::string::npos) << error;
  error = error_of([&] { write_mp4(path("o.mp4"), random_frames(2, 47, 64), 16); });
  EXPECT_NE(error.find("64x47"), std::string::npos) << error;
  error = error_of([&] { write_mp4(path("o.mp4"), random_frames(2, 4, 4), 0); });
  EXPECT_NE(error.find("fps"), std::string::npos) << error;
  EXPECT_TRUE(listing().empty());
}

TEST_F(FramesWriterTest, WithoutFfmpegMp4IsRefusedSayingHowToGetIt) {
  if (mp4_supported()) GTEST_SKIP() << "this build has MP4 output";
  const std::string error = error_of([&] { write_mp4(path("v.mp4"), random_frames(1, 2, 2), 16); });
  EXPECT_NE(error.find("v.mp4"), std::string::npos) << error;
  EXPECT_NE(error.find("scripts/setup.sh"), std::string::npos) << error;
  EXPECT_TRUE(listing().empty());
}

// ------------------------------------------------------------------------------ all writers

TEST_F(FramesWriterTest, WriteFramesPicksTheWriterByExtension) {
  const at::Tensor frames = random_frames(1, 4, 4);
  write_frames(path("A.NPY"), frames, 16);
  write_frames(path("b.png"), frames, 16);
  EXPECT_EQ(read_bytes(path("A.NPY")).substr(1, 5), "NUMPY");
  EXPECT_EQ(read_bytes(path("b.png")).substr(1, 3), "PNG");
  std::set<std::string> expected = {"A.NPY", "b.png"};
  if (mp4_supported()) {
    write_frames(path("c.Mp4"), frames, 16);
    EXPECT_EQ(read_bytes(path("c.Mp4")).substr(4, 4), "ftyp");
    expected.insert("c.Mp4");
  }
  for (const std::string name : {"d.gif", "noext"}) {
    const std::string error = error_of([&] { write_frames(path(name), frames, 16); });
    EXPECT_NE(error.find(name), std::string::npos) << error;
    for (const char* ext : {".mp4", ".png", ".npy"}) {
      EXPECT_NE(error.find(ext), std::string::npos) << error;
    }
  }
  EXPECT_EQ(listing(), expected);
}

TEST_F(FramesWriterTest, BadTensorsAreRefusedBeforeAnyFileExists) {
  for (const std::string& name : each_format("t")) {
    EXPECT_NE(error_of([&] {
                write_frames(path(name), at::zeros({2, 4, 4, 4}), 16);
              }).find("[F, H, W, 3]"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                write_frames(path(name), at::zeros({4, 4, 3}), 16);
              }).find("[F, H, W, 3]"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                write_frames(path(name), at::zeros({0, 4, 4, 3}), 16);
              }).find("empty"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                write_frames(path(name), at::zeros({1, 4, 4, 3}, at::kByte), 16);
              }).find("floating point"),
              std::string::npos);
    EXPECT_NE(error_of([&] { write_frames(path(name), at::Tensor(), 16); }).find("undefined"),
              std::string::npos);
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(FramesWriterTest, AnExistingFileIsReplaced) {
  write_bytes(path("r.npy"), "old");
  const at::Tensor frames = random_frames(1, 2, 2);
  write_npy(path("r.npy"), frames);
  EXPECT_EQ(read_bytes(path("r.npy")).substr(128), raw_bytes(frames));
  EXPECT_EQ(listing(), (std::set<std::string>{"r.npy"}));
}

TEST_F(FramesWriterTest, ADirectoryAsTargetFailsAndLeavesNoTemporaryFile) {
  for (const std::string& name : each_format("d")) {
    fs::create_directory(path(name));
    const std::string error =
        error_of([&] { write_frames(path(name), random_frames(1, 2, 2), 8); });
    EXPECT_NE(error.find(name), std::string::npos) << error;
    EXPECT_NE(error.find("directory"), std::string::npos) << error;
    EXPECT_TRUE(fs::is_directory(path(name)));
  }
  const auto names = each_format("d");
  EXPECT_EQ(listing(), std::set<std::string>(names.begin(), names.end()));
}

TEST_F(FramesWriterTest, AMissingFolderFailsNamingIt) {
  for (const std::string& name : each_format("missing/a")) {
    const std::string error =
        error_of([&] { write_frames(path(name), random_frames(1, 2, 2), 8); });
    EXPECT_NE(error.find(path("missing")), std::string::npos) << error;
    EXPECT_NE(error.find("No such file or directory"), std::string::npos) << error;
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(FramesWriterTest, AnUnwritableFolderFailsAndLeavesNothing) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only folders";
  fs::create_directory(path("ro"));
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  for (const std::string& name : each_format("ro/a")) {
    const std::string error =
        error_of([&] { write_frames(path(name), random_frames(1, 2, 2), 8); });
    EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
  }
  fs::permissions(path("ro"), fs::perms::owner_all);
  EXPECT_TRUE(fs::is_empty(path("ro")));
}

}  // namespace
}  // namespace omni::models
