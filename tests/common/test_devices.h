// Devices the engine tests run on: the simulated CPU device always, CUDA when this build has
// the CUDA engine and a GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_offload/transfer_engine.h"

namespace omni::testing {

inline bool cuda_usable() {
  static const bool usable = [] {
    if (!offload::cuda_engine_built()) return false;
    try {
      offload::make_cuda_engine({});
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return usable;
}

inline std::vector<offload::DeviceKind> all_devices() {
  return {offload::DeviceKind::kCpuSim, offload::DeviceKind::kCuda};
}

inline std::string device_name(const ::testing::TestParamInfo<offload::DeviceKind>& info) {
  return offload::to_string(info.param);
}

}  // namespace omni::testing

namespace omni::offload {
// Readable parameter values in gtest output.
inline void PrintTo(DeviceKind kind, std::ostream* os) { *os << to_string(kind); }
}  // namespace omni::offload

// First line of a device-parameterized test: skips CUDA cases (with the reason) where there
// is no usable GPU.
#define OMNI_SKIP_IF_DEVICE_MISSING(kind)                                                \
  do {                                                                                   \
    if ((kind) == ::omni::offload::DeviceKind::kCuda && !::omni::testing::cuda_usable()) \
      GTEST_SKIP() << "no usable CUDA device (or built without CUDA)";                   \
  } while (0)
