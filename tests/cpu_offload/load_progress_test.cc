// Progress lines while weights are placed (load_progress.h): what packing and streaming count,
// when a line is printed, and that nothing is printed without a LoadProgress.
#include "cpu_offload/load_progress.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "cpu_offload/transfer_engine.h"
#include "cpu_offload/weight_store.h"

namespace omni::offload {
namespace {

std::vector<std::pair<std::string, at::Tensor>> three_tensors() {
  return {{"a", at::randn({64, 32})}, {"b", at::randn({100})}, {"c", at::randn({7, 3})}};
}
constexpr uint64_t kSourceBytes = (64 * 32 + 100 + 7 * 3) * 4;  // float32

size_t count_lines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(LoadProgress, PackingCountsTheSourceBytesOfEveryTensor) {
  auto engine = make_cpu_sim_engine({});
  // bf16 slabs from float32 sources: the count is of the checkpoint's bytes, read.
  const DtypeByName to_bf16 = {{"a", at::kBFloat16}, {"b", at::kBFloat16}, {"c", at::kBFloat16}};
  for (const DtypeByName* convert : {static_cast<const DtypeByName*>(nullptr), &to_bf16}) {
    SCOPED_TRACE(convert ? "converted" : "as stored");
    LoadProgress progress("packing", kSourceBytes, /*interval_s=*/3600);
    OffloadUnit unit("u", three_tensors(), *engine, /*pin=*/true, convert);
    EXPECT_EQ(progress.done_bytes(), kSourceBytes);
    EXPECT_EQ(progress.lines(), 0);  // shorter than the interval: silent
  }
}

TEST(LoadProgress, StreamingToTheDeviceCountsEveryChunk) {
  auto engine = make_cpu_sim_engine({});
  LoadProgress progress("streaming", kSourceBytes, /*interval_s=*/3600);
  auto unit = OffloadUnit::layout_only("resident", three_tensors());
  const DeviceBuffer buffer = engine->allocate_device(unit->bytes());
  // A 1 KiB staging buffer: the 8 KiB tensor goes in many chunks.
  unit->stream_to_device(*engine, buffer, 0, /*staging_bytes=*/1024, /*pin=*/true);
  EXPECT_EQ(progress.done_bytes(), kSourceBytes);
}

TEST(LoadProgress, LinesComeEveryIntervalAndNestedJobsCountTowardTheOuterOne) {
  auto engine = make_cpu_sim_engine({});
  testing::internal::CaptureStderr();
  {
    LoadProgress outer("placing the weights of test", 2 * kSourceBytes, /*interval_s=*/0);
    OffloadUnit first("u1", three_tensors(), *engine, /*pin=*/true);
    {
      LoadProgress inner("inner", kSourceBytes, /*interval_s=*/3600);
      OffloadUnit second("u2", three_tensors(), *engine, /*pin=*/true);
      EXPECT_EQ(inner.done_bytes(), kSourceBytes);
      EXPECT_EQ(outer.done_bytes(), kSourceBytes);  // the inner one takes the adds...
    }
    EXPECT_EQ(outer.done_bytes(), 2 * kSourceBytes);  // ...and hands them on when it ends
    EXPECT_EQ(outer.lines(), 3);  // one per tensor of the first unit: the interval is 0
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_lines(err, "placing the weights of test: "), 4u) << err;
  EXPECT_NE(err.find(" of 0.0 GB (50%) after "), std::string::npos) << err;
  EXPECT_NE(err.find("placing the weights of test: 0.0 GB placed in "), std::string::npos) << err;
  EXPECT_EQ(err.find("inner"), std::string::npos) << err;
}

TEST(LoadProgress, NothingIsCountedOrPrintedWithoutOne) {
  auto engine = make_cpu_sim_engine({});
  testing::internal::CaptureStderr();
  OffloadUnit unit("u", three_tensors(), *engine, /*pin=*/true);
  LoadProgress later("later", kSourceBytes, /*interval_s=*/0);
  EXPECT_EQ(later.done_bytes(), 0u);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(LoadProgress, ModuleBytesCountATiedWeightOnce) {
  struct Tied : torch::nn::Module {
    Tied() {
      auto w = register_parameter("embed", at::randn({10, 4}));
      register_parameter("head", w);  // the same tensor under two names
      register_buffer("scale", at::ones({3}));
    }
  } tied;
  EXPECT_EQ(module_tensor_bytes(tied), (10u * 4 + 3) * 4);
}

}  // namespace
}  // namespace omni::offload
