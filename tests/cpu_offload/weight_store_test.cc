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
  Mixed m;
  const auto w = m.w.clone(), h = m.h.clone(), bf = m.bf.clone(), ids = m.ids.clone();
  OffloadUnit unit("mixed", named(m), *engine, /*pin=*/true);

  EXPECT_EQ(unit.tensor_bytes(), 60u + 14u + 36u + 88u);
  EXPECT_EQ(unit.bytes(), 64u * 3 + 128u);  // each tensor at a 64-byte boundary
  EXPECT_EQ(engine->host_counter()->current(), unit.bytes());
  for (const auto& t : unit.tensors()) EXPECT_EQ(t.offset % kTensorAlignment, 0u) << t.name;
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
  Mixed m;
  OffloadUnit unit("mixed", named(m), *engine, false);
  DeviceBuffer small = engine->allocate_device(unit.bytes() - 1);
  EXPECT_THROW(unit.bind(small, 0), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, WeightStoreTest,
                         ::testing::ValuesIn(omni::testing::all_devices()),
                         omni::testing::device_name);

}  // namespace
}  // namespace omni::offload
