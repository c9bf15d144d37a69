// SafetensorsFile and write_safetensors: round trips of every dtype, zero-copy views of the
// mapping, and a precise error (naming the file and tensor) for each way a file can be broken.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::write_bytes;
using testing::write_raw_safetensors;

class SafetensorsTest : public testing::TempDirTest {};

// One tensor per dtype the format maps, with shapes that include a scalar and an empty tensor.
std::vector<std::pair<std::string, at::Tensor>> every_dtype() {
  at::manual_seed(7);
  const auto f32 = at::randn({3, 5});
  return {
      {"f64", at::randn({4, 2}, at::kDouble)},
      {"f32", f32},
      {"f16", at::randn({7}).to(at::kHalf)},
      {"bf16", at::randn({2, 3, 3}).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {5}, at::kLong)},
      {"i32", at::randint(-100000, 100000, {3, 3}, at::kInt)},
      {"i16", at::randint(-30000, 30000, {9}, at::kShort)},
      {"i8", at::randint(-128, 127, {11}, at::kChar)},
      {"u8", at::randint(0, 255, {13}, at::kByte)},
      {"bool", at::rand({6}) > 0.5},
      {"f8_e4m3", f32.to(at::kFloat8_e4m3fn)},
      {"f8_e5m2", f32.to(at::kFloat8_e5m2)},
      {"scalar", at::scalar_tensor(3.25, at::kFloat)},
      {"empty", at::empty({0, 3}, at::kFloat)},
  };
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.contiguous(), y = b.contiguous();
  if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes()) return false;
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeBitwiseAndViewsTheMapping) {
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo"}};
  write_safetensors(path("all.safetensors"), tensors, metadata);
  const std::string raw = read_bytes(path("all.safetensors"));

  const auto file = SafetensorsFile::open(path("all.safetensors"));
  EXPECT_EQ(file.path(), path("all.safetensors"));
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.size(), tensors.size());
  std::vector<std::string> expected_names;
  for (const auto& [name, t] : tensors) expected_names.push_back(name);
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ(file.names(), expected_names);

  for (const auto& [name, original] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file.has(name));
    const TensorInfo& info = file.info(name);
    EXPECT_EQ(info.name, name);
    EXPECT_EQ(info.dtype, original.scalar_type());
    EXPECT_EQ(info.shape, original.sizes().vec());
    EXPECT_EQ(info.nbytes, original.nbytes());
    // The absolute offset points at the tensor's bytes in the file itself.
    ASSERT_LE(info.offset + info.nbytes, raw.size());
    if (info.nbytes > 0) {  // an empty tensor's data_ptr() is null, and memcmp must not get one
      EXPECT_EQ(
          std::memcmp(raw.data() + info.offset, original.contiguous().data_ptr(), info.nbytes), 0);
    }

    const at::Tensor loaded = file.tensor(name);
    EXPECT_EQ(loaded.device(), at::Device(at::kCPU));
    EXPECT_TRUE(same_bytes(loaded, original));
    if (original.numel() > 0) {
      EXPECT_EQ(loaded.data_ptr(), static_cast<const void*>(file.data(name)));  // zero-copy
      EXPECT_EQ(std::memcmp(file.data(name), original.contiguous().data_ptr(), info.nbytes), 0);
    }
  }
  EXPECT_FALSE(std::filesystem::exists(path("all.safetensors.tmp")));
}

TEST_F(SafetensorsTest, TensorsKeepTheMappingAliveAfterTheFileObjectAndFileAreGone) {
  const auto original = at::arange(1000, at::kFloat);
  write_safetensors(path("w.safetensors"), {{"w", original}});
  std::optional<SafetensorsFile> file = SafetensorsFile::open(path("w.safetensors"));
  const at::Tensor view = file->tensor("w");
  const void* mapped = file->data("w");
  file.reset();
  std::filesystem::remove(path("w.safetensors"));
  EXPECT_EQ(view.data_ptr(), mapped);
  EXPECT_TRUE(at::equal(view, original));  // reads the still-mapped pages
}

TEST_F(SafetensorsTest, WriterPadsTheHeaderAndAlignsEveryTensor) {
  // Written smallest element first: the writer must still place the F64 data first.
  write_safetensors(path("a.safetensors"), {{"u8", at::ones({3}, at::kByte)},
                                            {"f16", at::ones({1}, at::kHalf)},
                                            {"f64", at::ones({2}, at::kDouble)}});
  const std::string raw = read_bytes(path("a.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, raw.size());
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // only spaces after the JSON

  const auto file = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(file.info("f64").offset, 8 + n);
  EXPECT_EQ(file.info("f16").offset, 8 + n + 16);
  EXPECT_EQ(file.info("u8").offset, 8 + n + 18);
  for (const auto& name : file.names()) {
    EXPECT_EQ(file.info(name).offset % c10::elementSize(file.info(name).dtype), 0u) << name;
  }
}

TEST_F(SafetensorsTest, UnalignedDataFromOtherWritersIsCopiedNotViewed) {
  // U8 [1] at [0, 1), then F32 [2] at [1, 9): the floats start at an odd address.
  write_raw_safetensors(path("u.safetensors"),
                        R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})",
                        9);
  const auto file = SafetensorsFile::open(path("u.safetensors"));
  const at::Tensor f = file.tensor("f");
  EXPECT_NE(f.data_ptr(), static_cast<const void*>(file.data("f")));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data_ptr()) % alignof(float), 0u);
  EXPECT_EQ(std::memcmp(f.data_ptr(), file.data("f"), 8), 0);
  EXPECT_EQ(file.tensor("b").data_ptr(), static_cast<const void*>(file.data("b")));
}

TEST_F(SafetensorsTest, MissingTensorErrorNamesTheFileAndSimilarNames) {
  write_safetensors(path("m.safetensors"), {{"model.layers.0.mlp.weight", at::ones({1})},
                                            {"model.layers.1.mlp.weight", at::ones({1})},
                                            {"lm_head.weight", at::ones({1})}});
  const auto file = SafetensorsFile::open(path("m.safetensors"));
  EXPECT_FALSE(file.has("model.layers.0.mlp.weights"));
  const std::string msg = error_of([&] { file.info("model.layers.0.mlp.weights"); });
  EXPECT_CONTAINS(msg, path("m.safetensors"));
  EXPECT_CONTAINS(msg, "no tensor 'model.layers.0.mlp.weights'");
  EXPECT_CONTAINS(msg, "similar: 'model.layers.0.mlp.weight', 'model.layers.1.mlp.weight'");
  EXPECT_CONTAINS(error_of([&] { file.tensor("nope"); }), "no tensor 'nope'");
  EXPECT_CONTAINS(error_of([&] { file.data("nope"); }), "no tensor 'nope'");
}

TEST_F(SafetensorsTest, MissingFileAndDirectoryAreErrors) {
  const std::string missing = error_of([&] { SafetensorsFile::open(path("none.safetensors")); });
  EXPECT_CONTAINS(missing, "cannot open safetensors file '" + path("none.safetensors") + "'");
  EXPECT_CONTAINS(missing, "No such file");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile::open(dir()); }), "not a regular file");
}

TEST_F(SafetensorsTest, WriterFailureLeavesNoFileAndKeepsTheOldOne) {
  write_safetensors(path("keep.safetensors"), {{"w", at::ones({2})}});
  const std::string before = read_bytes(path("keep.safetensors"));

  const std::string msg = error_of([&] {
    write_safetensors(path("keep.safetensors"),
                      {{"ok", at::ones({2})}, {"c", at::ones({2}, at::kComplexFloat)}});
  });
  EXPECT_CONTAINS(msg, "tensor 'c'");
  EXPECT_CONTAINS(msg, "safetensors cannot store");
  EXPECT_EQ(read_bytes(path("keep.safetensors")), before);

  EXPECT_CONTAINS(
      error_of([&] {
        write_safetensors(path("dup.safetensors"), {{"w", at::ones({1})}, {"w", at::ones({1})}});
      }),
      "duplicate tensor name 'w'");
  EXPECT_CONTAINS(error_of([&] {
                    write_safetensors(path("no_such_dir/x.safetensors"), {{"w", at::ones({1})}});
                  }),
                  "cannot create");
  // A failure after the temporary file was written (renaming onto a directory) removes it.
  std::filesystem::create_directories(path("adir/sub"));
  EXPECT_CONTAINS(error_of([&] {
                    write_safetensors(path("adir"), {{"w", at::ones({1})}});
                  }),
                  "renaming '" + path("adir.tmp") + "'");

  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir())) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"adir", "keep.safetensors"}));
}

// --- corrupt files ---------------------------------------------------------------------------

struct Corrupt {
  std::string name;
  std::string header;
  size_t data_size;
  int64_t header_size;                // -1: the header's own size
  std::vector<std::string> expected;  // each must appear in the error, besides the file path
};

// Names the case in failure messages instead of dumping the struct's bytes.
void PrintTo(const Corrupt& c, std::ostream* os) { *os << c.name; }

class CorruptSafetensorsTest : public testing::TempDirTest,
                               public ::testing::WithParamInterface<Corrupt> {};

TEST_P(CorruptSafetensorsTest, ErrorNamesTheFileAndTheProblem) {
  const Corrupt& c = GetParam();
  const std::string file = path(c.name + ".safetensors");
  if (c.name == "empty") {
    write_bytes(file, "");
  } else if (c.name == "short") {
    write_bytes(file, std::string("\x10\x00\x00", 3));
  } else {
    write_raw_safetensors(file, c.header, c.data_size, c.header_size);
  }
  const std::string msg = error_of([&] { SafetensorsFile::open(file); });
  EXPECT_CONTAINS(msg, "safetensors file '" + file + "'");
  for (const auto& part : c.expected) EXPECT_CONTAINS(msg, part);
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

INSTANTIATE_TEST_SUITE_P(
    Files, CorruptSafetensorsTest,
    ::testing::Values(
        Corrupt{"empty", "", 0, -1, {"file is 0 bytes, shorter than the 8-byte"}},
        Corrupt{"short", "", 0, -1, {"file is 3 bytes"}},
        Corrupt{"header_past_end", "{}", 10, 1000, {"header length 1000 exceeds the 12 bytes"}},
        Corrupt{"not_json", "{\"w\": nope}", 0, -1, {"header is not valid JSON", "parse error"}},
        Corrupt{"not_object", "[1, 2]", 0, -1, {"header must be a JSON object, got array"}},
        Corrupt{"unknown_dtype",
                "{" + entry("w", "F7", "[1]", "[0,4]") + "}",
                4,
                -1,
                {"tensor 'w'", "unknown dtype 'F7'", "BF16"}},
        Corrupt{"size_mismatch",
                "{" + entry("w", "F32", "[2,3]", "[0,20]") + "}",
                24,
                -1,
                {"tensor 'w'", "[0, 20] hold 20 bytes but F32 [2, 3] needs 24"}},
        Corrupt{"truncated_data",
                "{" + entry("w", "F32", "[4]", "[0,16]") + "}",
                8,
                -1,
                {"tensor 'w'", "run past the end of the data section (8 bytes"}},
        Corrupt{"overlap",
                "{" + entry("a", "F32", "[4]", "[0,16]") + "," +
                    entry("b", "F32", "[4]", "[8,24]") + "}",
                24,
                -1,
                {"tensors 'a' and 'b' overlap (data_offsets [0, 16] and [8, 24])"}},
        Corrupt{"negative_shape",
                "{" + entry("w", "F32", "[-1,4]", "[0,16]") + "}",
                16,
                -1,
                {"tensor 'w'", "'shape' must be an array of non-negative integers, got [-1,4]"}},
        Corrupt{"float_shape",
                "{" + entry("w", "F32", "[1.5]", "[0,4]") + "}",
                4,
                -1,
                {"tensor 'w'", "non-negative integers"}},
        Corrupt{"begin_after_end",
                "{" + entry("w", "F32", "[1]", "[8,4]") + "}",
                8,
                -1,
                {"tensor 'w'", "begin > end"}},
        Corrupt{"missing_offsets",
                R"({"w":{"dtype":"F32","shape":[1]}})",
                4,
                -1,
                {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
        Corrupt{"entry_not_object", R"({"w":[1]})", 0, -1, {"tensor 'w'", "must be an object"}},
        Corrupt{"metadata_not_strings",
                R"({"__metadata__":{"format":1}})",
                0,
                -1,
                {"'__metadata__' value 'format' must be a string, got number"}},
        Corrupt{"metadata_not_object",
                R"({"__metadata__":"pt"})",
                0,
                -1,
                {"'__metadata__' must be an object of strings, got string"}}),
    [](const ::testing::TestParamInfo<Corrupt>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace omni::models
