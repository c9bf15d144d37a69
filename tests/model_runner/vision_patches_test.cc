// Image decoding and Qwen vision patches against Hugging Face's chat-template path
// (transformers' load_image, then Qwen2VLImageProcessorPil): tests/fixtures/qwen3_omni_tiny
// (make_qwen3_omni_fixture.py) and tests/fixtures/vision (make_vision_fixture.py).
#include <ATen/ATen.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/from_blob.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::TempDirTest;
using testing::write_bytes;

const std::string kFixtures = OMNI_FIXTURES_DIR;
const std::string kVision = kFixtures + "/vision";

at::Tensor as_tensor(const RgbImage& image) {
  return at::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3},
                       at::kByte);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

VisionPatchOptions options_from_json(const nlohmann::json& j) {
  VisionPatchOptions opt;
  opt.patch_size = j.at("patch_size").get<int64_t>();
  opt.temporal_patch_size = j.at("temporal_patch_size").get<int64_t>();
  opt.merge_size = j.at("merge_size").get<int64_t>();
  opt.min_pixels = j.at("min_pixels").get<int64_t>();
  opt.max_pixels = j.at("max_pixels").get<int64_t>();
  for (int c = 0; c < 3; ++c) {
    opt.image_mean[c] = j.at("image_mean").at(c).get<double>();
    opt.image_std[c] = j.at("image_std").at(c).get<double>();
  }
  return opt;
}

// The fixture the thinker tests use: 96x64 RGB, a multiple of patch 16 x merge 2, so the
// processor does not resize; Qwen3-Omni's patch 16, temporal 2, merge 2, mean = std = 0.5.
TEST(VisionPatches, MatchesQwen3OmniTinyReference) {
  const RgbImage image = read_image_file(kFixtures + "/qwen3_omni_tiny/image.png");
  ASSERT_EQ(image.height, 64);
  ASSERT_EQ(image.width, 96);
  const VisionPatches patches = image_to_patches(image, VisionPatchOptions{});
  const auto ref = SafetensorsFile::open(kFixtures + "/qwen3_omni_tiny/reference.safetensors");
  const at::Tensor expected = ref.tensor("pixel_values");
  ASSERT_EQ(patches.pixel_values.sizes(), expected.sizes());
  EXPECT_EQ(patches.pixel_values.scalar_type(), at::kFloat);
  EXPECT_LE(max_abs_diff(patches.pixel_values, expected), 1e-6);
  EXPECT_TRUE(patches.pixel_values.equal(expected)) << "not bit-identical";
  const at::Tensor grid = ref.tensor("image_grid_thw");
  ASSERT_EQ(grid.numel(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(patches.grid_thw[i], grid.view({-1})[i].item<int64_t>());
  EXPECT_EQ(patches.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
}

// Each case of tests/fixtures/vision: the decoded RGB equals transformers' load_image(path)
// (Image.open, exif_transpose, convert("RGB")) exactly, and the patches equal the processor's;
// the resize paths (bicubic up, antialiased down, one axis each way) reproduce Pillow bit for
// bit. Files load_image refuses are refused with the reason.
TEST(VisionPatches, MatchesHfLoadImageOnVisionFixture) {
  const auto expected = SafetensorsFile::open(kVision + "/expected.safetensors");
  const auto cases = nlohmann::json::parse(expected.metadata().at("cases"));
  ASSERT_EQ(cases.size(), 25u);
  int with_patches = 0, refused = 0;
  for (const auto& [name, spec] : cases.items()) {
    SCOPED_TRACE(name);
    const std::string path = kVision + "/" + spec.at("file").get<std::string>();
    if (spec.contains("error")) {
      ++refused;
      const std::string error = error_of([&] { read_image_file(path); });
      EXPECT_CONTAINS(error, path);
      EXPECT_CONTAINS(error, spec.at("error").get<std::string>());
      continue;
    }
    const RgbImage image = read_image_file(path);
    const at::Tensor rgb = expected.tensor(name + ".rgb");
    ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{image.height, image.width, 3}));
    const double decode_diff = max_abs_diff(as_tensor(image), rgb);
    EXPECT_EQ(decode_diff, 0.0) << "decoded pixels differ from load_image's";
    RecordProperty(name + "_decode_max_abs_diff", std::to_string(decode_diff));
    if (spec.at("options").is_null()) continue;

    ++with_patches;
    const VisionPatches patches = image_to_patches(image, options_from_json(spec.at("options")));
    const at::Tensor pixel_values = expected.tensor(name + ".pixel_values");
    ASSERT_EQ(patches.pixel_values.sizes(), pixel_values.sizes());
    const double patch_diff = max_abs_diff(patches.pixel_values, pixel_values);
    EXPECT_LE(patch_diff, 1e-6);
    EXPECT_TRUE(patches.pixel_values.equal(pixel_values)) << "not bit-identical";
    const at::Tensor grid = expected.tensor(name + ".image_grid_thw").view({-1});
    for (int i = 0; i < 3; ++i) EXPECT_EQ(patches.grid_thw[i], grid[i].item<int64_t>());
    RecordProperty(name + "_patches_max_abs_diff", std::to_string(patch_diff));
  }
  EXPECT_EQ(with_patches, 9);
  EXPECT_EQ(refused, 2);
}

// The bug this guards against: an RGBA file given by path was composited onto white (what the
// processor's convert_to_rgb does to an in-memory RGBA image), where Hugging Face's chat
// template loads it with convert("RGB"), which drops alpha. Checked against the file's own
// samples, independently of the Python reference: the RGB is the stored colour channels,
// including under fully and partly transparent pixels.
TEST(VisionPatches, RgbaFileKeepsColourChannelsUnderTransparency) {
  const auto expected = SafetensorsFile::open(kVision + "/expected.safetensors");
  const at::Tensor rgba = expected.tensor("rgba_alpha_png.rgba");
  const RgbImage image = read_image_file(kVision + "/rgba_alpha.png");
  ASSERT_EQ(rgba.sizes(), (std::vector<int64_t>{image.height, image.width, 4}));
  const at::Tensor alpha = rgba.select(2, 3).to(at::kInt);
  const at::Tensor colour = rgba.narrow(2, 0, 3);
  ASSERT_GT(alpha.eq(0).sum().item<int64_t>(), 0);
  ASSERT_GT((alpha.gt(0) & alpha.lt(255)).sum().item<int64_t>(), 0) << "no partial alpha";
  ASSERT_GT(alpha.eq(255).sum().item<int64_t>(), 0);
  // Some transparent pixels are not white, so compositing onto white would change them.
  ASSERT_TRUE((colour.ne(255).any(2) & alpha.lt(255)).any().item<bool>());
  EXPECT_TRUE(as_tensor(image).equal(colour)) << "alpha was not simply dropped";
}

// exif_transpose: orientations 5..8 swap width and height, and the rotated photo goes through
// smart_resize as a portrait image (the fixture's grid is 4 x 2 merge groups of patches).
TEST(VisionPatches, ExifOrientationIsApplied) {
  const RgbImage upright = read_image_file(kVision + "/photo.jpg");
  const RgbImage rotated = read_image_file(kVision + "/photo_o6.jpg");
  EXPECT_EQ(rotated.height, upright.width);
  EXPECT_EQ(rotated.width, upright.height);
  for (int orientation = 2; orientation <= 8; ++orientation) {
    SCOPED_TRACE(orientation);
    const RgbImage image =
        read_image_file(kVision + "/orient_" + std::to_string(orientation) + ".jpg");
    EXPECT_EQ(image.height, orientation >= 5 ? 6 : 4);
    EXPECT_EQ(image.width, orientation >= 5 ? 4 : 6);
  }
  const VisionPatchOptions options{8, 2, 2, 16 * 16, 32 * 32, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}};
  EXPECT_EQ(image_to_patches(rotated, options).grid_thw, (std::array<int64_t, 3>{1, 4, 2}));
}

TEST(VisionPatches, SmartResizeMatchesHf) {
  struct Case {
    int64_t h, w, factor, min_pixels, max_pixels, out_h, out_w;
  };
  // From transformers' smart_resize (image_processing_pil_qwen2_vl.py).
  const Case cases[] = {
      {64, 96, 32, 3136, 1003520, 64, 96},
      {48, 80, 32, 3136, 1003520, 64, 64},  // halves
      {50, 75, 32, 1024, 2048, 32, 32},
      {30, 40, 32, 2048, 4096, 64, 64},
      {10, 1000, 32, 3136, 1003520, 32, 576},
      {1080, 1920, 32, 3136, 1003520, 736, 1312},
      {4000, 3000, 28, 3136, 12845056, 4004, 2996},
      {1, 150, 32, 3136, 1003520, 32, 704},
      {7, 7, 32, 3136, 1003520, 64, 64},
      {2000, 10, 32, 3136, 1003520, 800, 32},
      {16, 16, 32, 3136, 1003520, 64, 64},
      {3024, 4032, 32, 65536, 16777216, 3008, 4032},
  };
  for (const Case& c : cases) {
    const auto [h, w] = smart_resize(c.h, c.w, c.factor, c.min_pixels, c.max_pixels);
    EXPECT_EQ(h, c.out_h) << c.h << "x" << c.w;
    EXPECT_EQ(w, c.out_w) << c.h << "x" << c.w;
  }
  EXPECT_CONTAINS(error_of([] { smart_resize(1, 201, 32, 3136, 1003520); }),
                  "aspect ratio must be smaller than 200");
  EXPECT_CONTAINS(error_of([] { smart_resize(0, 20, 32, 3136, 1003520); }), "empty side");
}

TEST(VisionPatches, ResizeKeepsSizeAndDims) {
  RgbImage image;
  image.height = 5;
  image.width = 7;
  for (int i = 0; i < 5 * 7 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 7));
  EXPECT_EQ(resize_bicubic(image, 5, 7).pixels, image.pixels);  // unchanged: no resampling
  const RgbImage up = resize_bicubic(image, 11, 3);
  EXPECT_EQ(up.height, 11);
  EXPECT_EQ(up.width, 3);
  EXPECT_EQ(up.pixels.size(), 11u * 3 * 3);
  // A constant image stays constant through both passes (normalized coefficients).
  RgbImage flat{9, 13, std::vector<uint8_t>(9 * 13 * 3, 200)};
  for (auto [h, w] : {std::pair<int64_t, int64_t>{4, 5}, {20, 31}, {9, 2}, {1, 13}}) {
    const RgbImage r = resize_bicubic(flat, h, w);
    EXPECT_EQ(r.pixels, std::vector<uint8_t>(h * w * 3, 200)) << h << "x" << w;
  }
}

TEST(VisionPatches, RejectsInvalidInput) {
  RgbImage bad{4, 4, std::vector<uint8_t>(10)};
  EXPECT_CONTAINS(error_of([&] { image_to_patches(bad); }), "holds 10 bytes");
  RgbImage image{32, 32, std::vector<uint8_t>(32 * 32 * 3, 1)};
  VisionPatchOptions opt;
  opt.image_std[1] = 0.0;
  EXPECT_CONTAINS(error_of([&] { image_to_patches(image, opt); }), "image_std[1]");
}

class ImageFileTest : public TempDirTest {};

TEST_F(ImageFileTest, MissingFile) {
  const std::string path = this->path("nope.png");
  const std::string error = error_of([&] { read_image_file(path); });
  EXPECT_CONTAINS(error, path);
  EXPECT_CONTAINS(error, "No such file");
}

TEST_F(ImageFileTest, TruncatedPng) {
  const std::string bytes = read_bytes(kVision + "/rgba.png");
  for (size_t keep : {size_t{5}, size_t{20}, size_t{60}, bytes.size() / 2, bytes.size() - 20}) {
    SCOPED_TRACE(keep);
    const std::string path = this->path("truncated.png");
    write_bytes(path, bytes.substr(0, keep));
    const std::string error = error_of([&] { read_image_file(path); });
    EXPECT_CONTAINS(error, path);
    if (keep >= 8) {
      EXPECT_CONTAINS(error, "PNG");
    }
    if (keep >= 60) {
      EXPECT_CONTAINS(error, "truncated");
    }
  }
}

TEST_F(ImageFileTest, TruncatedJpeg) {
  const std::string bytes = read_bytes(kVision + "/photo.jpg");
  for (size_t keep : {size_t{100}, bytes.size() / 2, bytes.size() - 2}) {
    SCOPED_TRACE(keep);
    const std::string path = this->path("truncated.jpg");
    write_bytes(path, bytes.substr(0, keep));
    const std::string error = error_of([&] { read_image_file(path); });
    EXPECT_CONTAINS(error, path);
    EXPECT_CONTAINS(error, "JPEG");
  }
}

// A corrupt byte in the image data. Pillow does not check IDAT checksums and neither does the
// reader; both fail on the deflate stream (Pillow: "broken data stream").
TEST_F(ImageFileTest, CorruptPngData) {
  std::string bytes = read_bytes(kVision + "/rgba.png");
  bytes[bytes.size() / 2] ^= 0x55;  // inside IDAT
  const std::string path = this->path("corrupt.png");
  write_bytes(path, bytes);
  EXPECT_CONTAINS(error_of([&] { read_image_file(path); }), "corrupt PNG");
}

// After the image data, Pillow's load() reads the remaining chunks: one cut short by the end of
// the file makes it raise, a missing IEND does not.
TEST_F(ImageFileTest, TruncatedChunkAfterPngImageData) {
  const std::string bytes = read_bytes(kVision + "/idat_crc.png");
  ASSERT_EQ(bytes.substr(bytes.size() - 8, 4), "IEND");
  const std::string no_iend = this->path("no_iend.png");
  write_bytes(no_iend, bytes.substr(0, bytes.size() - 12));
  EXPECT_EQ(read_image_file(no_iend).pixels, read_image_file(kVision + "/idat_crc.png").pixels);
  const std::string cut = this->path("cut.png");
  write_bytes(cut, bytes.substr(0, bytes.size() - 12) + std::string("\0\0\0\x20tEXtabc", 11));
  const std::string error = error_of([&] { read_image_file(cut); });
  EXPECT_CONTAINS(error, "truncated PNG");
  EXPECT_CONTAINS(error, "tEXt");
}

TEST_F(ImageFileTest, NotAnImage) {
  const std::string text = this->path("notes.png");
  write_bytes(text, "this is a text file, not a PNG\n");
  std::string error = error_of([&] { read_image_file(text); });
  EXPECT_CONTAINS(error, text);
  EXPECT_CONTAINS(error, "not a PNG or JPEG image");

  const std::string empty = this->path("empty.jpg");
  write_bytes(empty, "");
  EXPECT_CONTAINS(error_of([&] { read_image_file(empty); }), "empty file");

  const std::string gif = this->path("anim.png");
  write_bytes(gif, std::string("GIF89a\x01\x00\x01\x00\x00\x00\x00;", 13));
  error = error_of([&] { read_image_file(gif); });
  EXPECT_CONTAINS(error, "unsupported format: GIF");

  EXPECT_CONTAINS(error_of([&] { read_image_file(dir()); }), "not a regular file");
}

TEST_F(ImageFileTest, DecodeFromMemoryMatchesFile) {
  const std::string bytes = read_bytes(kVision + "/photo.jpg");
  const RgbImage a = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  "photo.jpg (memory)");
  const RgbImage b = read_image_file(kVision + "/photo.jpg");
  EXPECT_EQ(a.height, b.height);
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.pixels, b.pixels);
}

TEST_F(ImageFileTest, OptionsFromPreprocessorConfig) {
  // Qwen3-Omni-style: size plus min/max_pixels, which win, and a scalar mean.
  write_bytes(path("preprocessor_config.json"), R"({
    "feature_extractor_type": "WhisperFeatureExtractor",
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 100, "longest_edge": 200000},
    "min_pixels": 3136, "max_pixels": 12845056,
    "image_mean": 0.25, "image_std": [0.1, 0.2, 0.3], "resample": 3,
    "rescale_factor": 0.00392156862745098, "do_convert_rgb": true})");
  const VisionPatchOptions opt = vision_options_from_preprocessor_config(dir());
  EXPECT_EQ(opt.patch_size, 14);
  EXPECT_EQ(opt.min_pixels, 3136);
  EXPECT_EQ(opt.max_pixels, 12845056);
  EXPECT_EQ(opt.image_mean, (std::array<double, 3>{0.25, 0.25, 0.25}));
  EXPECT_EQ(opt.image_std, (std::array<double, 3>{0.1, 0.2, 0.3}));

  write_bytes(path("size_only.json"), R"({"size": {"shortest_edge": 100, "longest_edge": 2000}})");
  const VisionPatchOptions sized = vision_options_from_preprocessor_config(path("size_only.json"));
  EXPECT_EQ(sized.min_pixels, 100);
  EXPECT_EQ(sized.max_pixels, 2000);
  EXPECT_EQ(sized.patch_size, 16);  // the default

  // The tiny fixture's file holds only audio fields: the defaults.
  const VisionPatchOptions tiny =
      vision_options_from_preprocessor_config(kFixtures + "/qwen3_omni_tiny");
  EXPECT_EQ(tiny.patch_size, 16);
  EXPECT_EQ(tiny.min_pixels, 56 * 56);
  EXPECT_EQ(tiny.max_pixels, 28 * 28 * 1280);

  write_bytes(path("bilinear.json"), R"({"resample": 2})");
  EXPECT_CONTAINS(error_of([&] { vision_options_from_preprocessor_config(path("bilinear.json")); }),
                  "only bicubic");
  write_bytes(path("bad_std.json"), R"({"image_std": [1, 2]})");
  EXPECT_CONTAINS(error_of([&] { vision_options_from_preprocessor_config(path("bad_std.json")); }),
                  "image_std must be a number or a list of 3");
  EXPECT_CONTAINS(error_of([&] { vision_options_from_preprocessor_config(path("missing.json")); }),
                  "does not exist");
}

}  // namespace
}  // namespace omni::models
