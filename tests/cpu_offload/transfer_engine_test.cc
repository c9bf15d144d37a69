// Transfer engines: copies land, are ordered after the events they wait on, are throttled
// and timed; host and device memory are counted exactly.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "../common/manual_event.h"
#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"

namespace omni::offload {
namespace {

class TransferEngineTest : public ::testing::TestWithParam<DeviceKind> {};

using omni::testing::ManualEvent;

void fill(const HostBuffer& buffer, uint8_t seed) {
  for (size_t i = 0; i < buffer.bytes(); ++i) buffer.data()[i] = static_cast<uint8_t>(seed + i * 7);
}

at::Tensor device_bytes(const DeviceBuffer& buffer, size_t offset, size_t bytes) {
  return buffer.bytes_tensor()
      .narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(bytes))
      .cpu();
}

at::Tensor host_bytes(const HostBuffer& buffer) {
  return at::from_blob(buffer.data(), {static_cast<int64_t>(buffer.bytes())}, at::kByte).clone();
}

TEST_P(TransferEngineTest, CopyMovesBytesAndCountsMemoryExactly) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  {
    HostBuffer src = engine->allocate_host(1000, /*pin=*/true);
    EXPECT_EQ(src.bytes(), 1000u);  // exact size, no rounding
    EXPECT_EQ(engine->host_counter()->current(), 1000u);
    if (GetParam() == DeviceKind::kCuda) {
      EXPECT_TRUE(src.pinned());
    }
    fill(src, 3);
    DeviceBuffer dst = engine->allocate_device(1536);
    EXPECT_EQ(engine->memory_counter()->current(), 1536u);
    Event done = engine->copy_async({CopyOp{src, 0, dst, 512, 1000}}, {});
    engine->compute_wait(done);
    engine->synchronize();
    EXPECT_TRUE(done.ready());
    EXPECT_TRUE(at::equal(device_bytes(dst, 512, 1000), host_bytes(src)));
    engine->collect_timings();
    EXPECT_EQ(engine->counters().bytes_h2d, 1000u);
    EXPECT_EQ(engine->counters().copies, 1u);
  }
  EXPECT_EQ(engine->memory_counter()->current(), 0u);
  EXPECT_EQ(engine->memory_counter()->peak(), 1536u);
  EXPECT_EQ(engine->host_counter()->current(), 0u);
}

TEST_P(TransferEngineTest, CopiesRunInSubmissionOrder) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer a = engine->allocate_host(4096, true);
  HostBuffer b = engine->allocate_host(4096, true);
  fill(a, 1);
  fill(b, 2);
  DeviceBuffer dst = engine->allocate_device(4096);
  for (int i = 0; i < 20; ++i) engine->copy_async({CopyOp{i % 2 ? b : a, 0, dst, 0, 4096}}, {});
  engine->copy_async({CopyOp{b, 0, dst, 0, 4096}}, {});
  engine->synchronize();
  EXPECT_TRUE(at::equal(device_bytes(dst, 0, 4096), host_bytes(b)));
}

TEST_P(TransferEngineTest, OutOfBoundsCopyIsRejected) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(100, false);
  DeviceBuffer dst = engine->allocate_device(64);
  EXPECT_THROW(engine->copy_async({CopyOp{src, 0, dst, 0, 100}}, {}), Error);
  EXPECT_THROW(engine->copy_async({CopyOp{src, 50, dst, 0, 60}}, {}), Error);
}

TEST_P(TransferEngineTest, AGroupCopyWithOneBadOpMovesNothing) {
  // Every op is validated before any is enqueued: the good first op must not have written
  // half a slot when the second one is rejected.
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(256, true);
  fill(src, 5);
  DeviceBuffer dst = engine->allocate_device(512);
  dst.bytes_tensor().zero_();
  EXPECT_THROW(engine->copy_async({CopyOp{src, 0, dst, 0, 256}, CopyOp{src, 0, dst, 384, 256}}, {}),
               Error);
  engine->synchronize();
  EXPECT_EQ(dst.bytes_tensor().sum().item<int64_t>(), 0);
  EXPECT_EQ(engine->counters().copies, 0u);
}

TEST_P(TransferEngineTest, AHostSourceDroppedWhileItsCopyIsQueuedLivesUntilTheCopyRan) {
  // Callers may drop their last handle to a source as soon as copy_async returns (a backend
  // torn down, a staging buffer replaced). Freed under a queued copy, the memory could be
  // reused before the copy reads it and the device would get someone else's bytes.
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  constexpr size_t kBytes = 1 << 20;
  HostBuffer src = engine->allocate_host(kBytes, /*pin=*/true);
  fill(src, 11);
  const at::Tensor expected = host_bytes(src);
  DeviceBuffer dst = engine->allocate_device(kBytes);
  // The simulated copy waits for an event of the test's, so it is surely still queued; the
  // CUDA engine lets go of its sources only when a later call finds the copy complete.
  std::vector<Event> after;
  std::shared_ptr<ManualEvent> compute;
  if (GetParam() == DeviceKind::kCpuSim) {
    compute = std::make_shared<ManualEvent>();
    after.emplace_back(compute);
  }
  Event done = engine->copy_async({CopyOp{src, 0, dst, 0, kBytes}}, after);
  src = HostBuffer();
  EXPECT_EQ(engine->host_counter()->current(), kBytes) << "freed under a queued copy";
  if (compute) compute->fire();
  engine->compute_wait(done);
  engine->synchronize();
  EXPECT_TRUE(at::equal(device_bytes(dst, 0, kBytes), expected));
  EXPECT_EQ(engine->host_counter()->current(), 0u) << "still held after the copy ran";
}

INSTANTIATE_TEST_SUITE_P(Devices, TransferEngineTest,
                         ::testing::ValuesIn(omni::testing::all_devices()),
                         omni::testing::device_name);

TEST(CpuSimEngine, CopyWaitsForTheEventsItIsOrderedAfter) {
  auto engine = make_cpu_sim_engine({});
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(256, false);
  fill(src, 9);
  DeviceBuffer dst = engine->allocate_device(256);
  dst.bytes_tensor().zero_();
  auto compute = std::make_shared<ManualEvent>();
  Event done = engine->copy_async({CopyOp{src, 0, dst, 0, 256}}, {Event(compute)});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.ready());
  EXPECT_EQ(dst.bytes_tensor().sum().item<int64_t>(), 0);  // slot not overwritten yet
  compute->fire();
  done.host_wait();
  EXPECT_TRUE(at::equal(device_bytes(dst, 0, 256), host_bytes(src)));
}

TEST(CpuSimEngine, AFinishedCopyHoldsNoReferenceToItsBuffers) {
  // Once compute has waited for a copy, freeing its destination must free (and un-count) the
  // memory at once: the copy thread may not keep it alive a little longer.
  auto engine = make_cpu_sim_engine({});
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(1 << 16, false);
  for (int i = 0; i < 300; ++i) {
    DeviceBuffer dst = engine->allocate_device(1 << 16);
    engine->compute_wait(engine->copy_async({CopyOp{src, 0, dst, 0, src.bytes()}}, {}));
    dst = DeviceBuffer();
    ASSERT_EQ(engine->memory_counter()->current(), 0u) << "iteration " << i;
  }
}

TEST(CpuSimEngine, BandwidthLimitThrottlesCopiesAndStallsAreMeasured) {
  TransferEngineOptions options;
  options.sim_bandwidth_bytes_per_s = 100e6;  // 4 MB take 40 ms
  auto engine = make_cpu_sim_engine(options);
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(4 << 20, false);
  DeviceBuffer dst = engine->allocate_device(4 << 20);
  TimeAccumulator copy_time, stall;
  const auto start = std::chrono::steady_clock::now();
  Event done = engine->copy_async({CopyOp{src, 0, dst, 0, src.bytes()}}, {}, &copy_time);
  engine->compute_wait(done, &stall);
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(elapsed_ms, 40.0);
  EXPECT_GE(copy_time.total_ms(), 40.0);
  EXPECT_GT(stall.total_ms(), 20.0);  // the wait began right after the copy was issued
  EXPECT_LE(stall.total_ms(), elapsed_ms);
  EXPECT_DOUBLE_EQ(engine->counters().stall_ms, stall.total_ms());
}

TEST(CpuSimEngine, ComputeTimingAccumulates) {
  auto engine = make_cpu_sim_engine({});
  auto compute_scope = engine->enter_compute();  // compute calls need one
  TimeAccumulator t;
  const int64_t token = engine->begin_compute_timing();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine->end_compute_timing(token, &t);
  EXPECT_GE(t.total_ms(), 5.0);
  EXPECT_EQ(t.count(), 1);
}

TEST(TransferEngineFactory, ParsesDevicesAndExplainsMissingCuda) {
  EXPECT_EQ(parse_device_kind("cpu"), DeviceKind::kCpuSim);
  EXPECT_EQ(parse_device_kind("cuda"), DeviceKind::kCuda);
  EXPECT_THROW(parse_device_kind("tpu"), Error);
  if (!cuda_engine_built()) {
    try {
      make_transfer_engine(DeviceKind::kCuda);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("OMNI_WITH_CUDA"), std::string::npos) << e.what();
    }
  }
  TransferEngineOptions bad;
  bad.sim_bandwidth_bytes_per_s = -1;
  EXPECT_THROW(make_cpu_sim_engine(bad), Error);
}

}  // namespace
}  // namespace omni::offload
