// SafetensorsCheckpoint: single files, sharded checkpoints through the index, and the errors
// for an index that does not match its shards.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;
using testing::write_bytes;

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

class SafetensorsCheckpointTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    at::manual_seed(3);
    a_ = at::randn({4, 4});
    b_ = at::randn({3}).to(at::kBFloat16);
    c_ = at::arange(6, at::kLong).reshape({2, 3});
    extra_ = at::ones({2});
  }
  // Shard 1 holds a and b; shard 2 holds c and a tensor the index does not list.
  void write_shards() {
    write_safetensors(path(kShard1), {{"a", a_}, {"b", b_}});
    write_safetensors(path(kShard2), {{"c", c_}, {"extra", extra_}});
  }
  void write_index(const std::string& weight_map) {
    write_bytes(path("model.safetensors.index.json"),
                R"({"metadata": {"total_size": 100}, "weight_map": )" + weight_map + "}");
  }
  std::string standard_map() const {
    return std::string(R"({"a": ")") + kShard1 + R"(", "b": ")" + kShard1 + R"(", "c": ")" +
           kShard2 + R"("})";
  }

  at::Tensor a_, b_, c_, extra_;
};

TEST_F(SafetensorsCheckpointTest, ShardedCheckpointThroughTheIndex) {
  write_shards();
  write_index(standard_map());
  const auto ckpt = SafetensorsCheckpoint::open(dir());
  EXPECT_EQ(ckpt.path(), dir());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.file_of("a"), path(kShard1));
  EXPECT_EQ(ckpt.file_of("b"), path(kShard1));
  EXPECT_EQ(ckpt.file_of("c"), path(kShard2));
  EXPECT_TRUE(at::equal(ckpt.tensor("a"), a_));
  EXPECT_TRUE(at::equal(ckpt.tensor("b"), b_));
  EXPECT_TRUE(at::equal(ckpt.tensor("c"), c_));
  EXPECT_EQ(ckpt.info("c").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ckpt.tensor("c").data_ptr(), static_cast<const void*>(ckpt.data("c")));
  // The index is the list of weights: a tensor only a shard has is not part of the model.
  EXPECT_FALSE(ckpt.has("extra"));
  EXPECT_TRUE(ckpt.files()[1].has("extra"));

  // The index file itself can be named instead of its directory.
  const auto by_index = SafetensorsCheckpoint::open(path("model.safetensors.index.json"));
  EXPECT_EQ(by_index.file_of("c"), path(kShard2));
}

TEST_F(SafetensorsCheckpointTest, IndexWinsOverASingleFile) {
  write_shards();
  write_index(standard_map());
  write_safetensors(path("model.safetensors"), {{"only", at::ones({1})}});
  const auto ckpt = SafetensorsCheckpoint::open(dir());
  EXPECT_TRUE(ckpt.has("a"));
  EXPECT_FALSE(ckpt.has("only"));
}

TEST_F(SafetensorsCheckpointTest, SingleFileDirectoryAndFilePath) {
  write_safetensors(path("model.safetensors"), {{"a", a_}, {"c", c_}});
  for (const std::string& p : {dir(), path("model.safetensors")}) {
    SCOPED_TRACE(p);
    const auto ckpt = SafetensorsCheckpoint::open(p);
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "c"}));
    EXPECT_EQ(ckpt.file_of("c"), path("model.safetensors"));
    EXPECT_TRUE(at::equal(ckpt.tensor("a"), a_));
  }
}

TEST_F(SafetensorsCheckpointTest, MissingShardFileNamesIndexShardAndTensor) {
  write_safetensors(path(kShard1), {{"a", a_}, {"b", b_}});
  write_index(standard_map());
  const std::string msg = error_of([&] { SafetensorsCheckpoint::open(dir()); });
  EXPECT_CONTAINS(msg, path("model.safetensors.index.json"));
  EXPECT_CONTAINS(msg, std::string("lists shard '") + kShard2 + "' (e.g. for tensor 'c')");
  EXPECT_CONTAINS(msg, "No such file");
}

TEST_F(SafetensorsCheckpointTest, TensorListedInIndexButAbsentFromItsShard) {
  write_shards();
  write_index(std::string(R"({"a": ")") + kShard1 + R"(", "c": ")" + kShard1 + R"("})");
  const std::string msg = error_of([&] { SafetensorsCheckpoint::open(dir()); });
  EXPECT_CONTAINS(msg,
                  "maps tensor 'c' to shard '" + path(kShard1) + "', which does not contain it");
}

TEST_F(SafetensorsCheckpointTest, DirectoryWithNeitherFileSaysWhatItHas) {
  write_safetensors(path("weights.safetensors"), {{"a", a_}});
  const std::string msg = error_of([&] { SafetensorsCheckpoint::open(dir()); });
  EXPECT_CONTAINS(msg, "checkpoint directory '" + dir() +
                           "' has none of model.safetensors.index.json, model.safetensors, "
                           "diffusion_pytorch_model.safetensors.index.json, "
                           "diffusion_pytorch_model.safetensors");
  EXPECT_CONTAINS(msg, "it has: weights.safetensors");
  EXPECT_CONTAINS(error_of([&] { SafetensorsCheckpoint::open(path("nowhere")); }),
                  "checkpoint '" + path("nowhere") + "' does not exist");
}

// A diffusers component folder (transformer/, vae/) names its weights diffusion_pytorch_model;
// transformers' model.safetensors wins where both are present.
TEST_F(SafetensorsCheckpointTest, DiffusersFolderOpensAndModelFileWins) {
  write_safetensors(path("diffusion_pytorch_model.safetensors"), {{"a", a_}});
  EXPECT_EQ(SafetensorsCheckpoint::open(dir()).names(), std::vector<std::string>{"a"});
  write_safetensors(path("model.safetensors"), {{"b", b_}});
  EXPECT_EQ(SafetensorsCheckpoint::open(dir()).names(), std::vector<std::string>{"b"});
}

TEST_F(SafetensorsCheckpointTest, MissingTensorNamesTheCheckpoint) {
  write_shards();
  write_index(standard_map());
  const auto ckpt = SafetensorsCheckpoint::open(dir());
  const std::string msg = error_of([&] { ckpt.tensor("bb"); });
  EXPECT_CONTAINS(msg, "checkpoint '" + dir() + "' has no tensor 'bb'");
  EXPECT_CONTAINS(msg, "similar: 'b'");
  EXPECT_CONTAINS(error_of([&] { ckpt.file_of("extra"); }), "no tensor 'extra'");
}

TEST_F(SafetensorsCheckpointTest, MalformedIndexes) {
  write_shards();
  write_index(R"({"a": "../model-00001-of-00002.safetensors"})");
  EXPECT_CONTAINS(error_of([&] { SafetensorsCheckpoint::open(dir()); }),
                  "tensor 'a' maps to shard '../model-00001-of-00002.safetensors', which is not "
                  "a file name relative to the index's directory");
  write_index(R"({"a": 1})");
  EXPECT_CONTAINS(error_of([&] { SafetensorsCheckpoint::open(dir()); }),
                  "weight_map['a'] must be a shard file name, got number");
  write_bytes(path("model.safetensors.index.json"), R"({"metadata": {}})");
  EXPECT_CONTAINS(error_of([&] { SafetensorsCheckpoint::open(dir()); }),
                  "has no 'weight_map' object");
  write_bytes(path("model.safetensors.index.json"), R"({"weight_map": {)");
  const std::string msg = error_of([&] { SafetensorsCheckpoint::open(dir()); });
  EXPECT_CONTAINS(
      msg, "checkpoint index '" + path("model.safetensors.index.json") + "' is not valid JSON");
}

}  // namespace
}  // namespace omni::models
