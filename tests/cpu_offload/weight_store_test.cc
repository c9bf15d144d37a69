// Offload units: one aligned slab per unit holding every dtype, originals released, views
// rebound in place, placeholders when unbound.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../common/test_devices.h"
#include "cpu_offload/check.h"
#include "cpu_offload/weight_store.h"

namespace omni::offload {
namespace {

class Mixed : public torch::nn::Module {
 public:
  Mixed() {
    w = register_parameter("w", at::randn({3, 5}), false);             // 60 bytes
    h = register_parameter("h", at::randn({7}).to(at::kHalf), false);  // 14 bytes
    bf = register_parameter("bf", at::randn({2, 9}).to(at::kBFloat16), false);
    ids = register_buffer("ids", at::arange(11, at::kLong));
  }
  at::Tensor w, h, bf, ids;
};

std::vector<std::pair<std::string, at::Tensor>> named(Mixed& m) {
  return {{"w", m.w}, {"h", m.h}, {"bf", m.bf}, {"ids", m.ids}};
}

class WeightStoreTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(WeightStoreTest, PacksEveryDtypeIntoOneAlignedSlabAndReleasesOriginals) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Mixed m;
  const auto w = m.w.clone(), h = m.h.clone(), bf = m.bf.clone(), ids = m.ids.clone();
  OffloadUnit unit("mixed", named(m), *engine, /*pin=*/true);

  EXPECT_EQ(unit.tensor_bytes(), 60u + 14u + 36u + 88u);
  EXPECT_EQ(unit.bytes(), 256u * 4);  // each tensor at a 256-byte boundary (cuBLASLt's largest)
  EXPECT_EQ(engine->host_counter()->current(), unit.bytes());
  for (const auto& t : unit.tensors()) EXPECT_EQ(t.offset % 256, 0u) << t.name;
  // The module no longer holds its own copy: the slab is the only one.
  EXPECT_EQ(m.w.numel(), 0);
  EXPECT_EQ(m.ids.numel(), 0);
  EXPECT_EQ(std::memcmp(unit.host().data() + unit.tensors()[0].offset, w.data_ptr(), 60), 0);

  DeviceBuffer slot = engine->allocate_device(unit.bytes() + 256);
  engine->compute_wait(engine->copy_async({unit.copy_to(slot, 256)}, {}));
  unit.bind(slot, 256);
  EXPECT_TRUE(unit.bound());
  EXPECT_EQ(m.w.device(), engine->compute_device());
  EXPECT_TRUE(at::equal(m.w.cpu(), w));
  EXPECT_TRUE(at::equal(m.h.cpu(), h));
  EXPECT_TRUE(at::equal(m.bf.cpu(), bf));
  EXPECT_TRUE(at::equal(m.ids.cpu(), ids));
  // Views into the slot, not copies.
  const auto* base = slot.data();
  EXPECT_EQ(static_cast<const uint8_t*>(m.w.data_ptr()), base + 256 + unit.tensors()[0].offset);
  // The module's registered parameter is the same tensor.
  EXPECT_TRUE(at::equal(m.named_parameters()["w"].cpu(), w));

  unit.unbind();
  EXPECT_FALSE(unit.bound());
  EXPECT_EQ(m.w.numel(), 0);
  EXPECT_THROW(at::matmul(at::ones({2, 3}), m.w), c10::Error);  // never computes silently
}

TEST_P(WeightStoreTest, BindRejectsABufferTooSmall) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Mixed m;
  OffloadUnit unit("mixed", named(m), *engine, false);
  DeviceBuffer small = engine->allocate_device(unit.bytes() - 1);
  EXPECT_THROW(unit.bind(small, 0), Error);
}

TEST_P(WeightStoreTest, ConvertsWhilePackingStraightIntoTheSlab) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Mixed m;
  const auto w = m.w.clone(), h = m.h.clone();
  const DtypeByName convert = {{"w", at::kBFloat16}, {"h", at::kFloat}};
  OffloadUnit unit("mixed", named(m), *engine, /*pin=*/false, &convert);
  EXPECT_EQ(unit.tensors()[0].dtype, at::kBFloat16);
  EXPECT_EQ(unit.tensors()[0].nbytes, 30u);
  EXPECT_EQ(unit.tensors()[1].nbytes, 28u);
  EXPECT_EQ(unit.bytes(), 256u * 4);
  // Only the slab grew: no converted copy of the unit beside it.
  EXPECT_EQ(engine->host_counter()->peak(), unit.bytes());

  DeviceBuffer slot = engine->allocate_device(unit.bytes());
  engine->compute_wait(engine->copy_async({unit.copy_to(slot, 0)}, {}));
  unit.bind(slot, 0);
  EXPECT_EQ(m.w.scalar_type(), at::kBFloat16);
  EXPECT_EQ(m.h.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(m.w.cpu(), w.to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(m.h.cpu(), h.to(at::kFloat)));
}

// Resident weights: no host slab; a staging buffer far smaller than the unit (tensors larger
// than a half of it go in pieces), originals let go as they reach the device.
TEST_P(WeightStoreTest, StreamsToTheDeviceThroughASmallStagingBuffer) {
  OMNI_SKIP_IF_DEVICE_MISSING(GetParam());
  auto engine = make_transfer_engine(GetParam());
  auto compute_scope = engine->enter_compute();  // compute calls need one
  torch::nn::Module m;
  auto big = m.register_parameter("big", at::randn({3000}), false);  // 12000 bytes
  auto half = m.register_parameter("half", at::randn({2500}).to(at::kHalf), false);
  auto empty = m.register_parameter("empty", at::randn({0}), false);
  auto ids = m.register_buffer("ids", at::arange(777, at::kLong));
  const auto big0 = big.clone(), half0 = half.clone(), ids0 = ids.clone();
  const DtypeByName convert = {{"half", at::kFloat}};
  auto unit = OffloadUnit::layout_only(
      "resident", {{"big", big}, {"half", half}, {"empty", empty}, {"ids", ids}}, &convert);
  EXPECT_FALSE(unit->host());
  EXPECT_EQ(engine->host_counter()->current(), 0u);
  EXPECT_EQ(big.numel(), 3000);  // untouched until streamed

  DeviceBuffer slot = engine->allocate_device(unit->bytes() + 512);
  const size_t staging = 4096;
  unit->stream_to_device(*engine, slot, 512, staging, /*pin=*/true);
  EXPECT_TRUE(unit->bound());
  EXPECT_LE(engine->host_counter()->peak(), staging);
  EXPECT_EQ(engine->host_counter()->current(), 0u);  // the staging buffer is gone
  EXPECT_EQ(big.device(), engine->compute_device());
  EXPECT_EQ(static_cast<const uint8_t*>(big.data_ptr()), slot.data() + 512);
  EXPECT_TRUE(at::equal(big.cpu(), big0));
  EXPECT_EQ(half.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(half.cpu(), half0.to(at::kFloat)));
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(at::equal(ids.cpu(), ids0));

  // A unit with a host slab (or already streamed) cannot be streamed again.
  EXPECT_THROW(unit->stream_to_device(*engine, slot, 512, staging, true), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, WeightStoreTest,
                         ::testing::ValuesIn(omni::testing::all_devices()),
                         omni::testing::device_name);

}  // namespace
}  // namespace omni::offload
