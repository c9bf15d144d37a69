// The listed option names (option_names.h) are what the CLIs and the stage YAML accept before
// the engine parses them: each must parse, and back to the same name, or a value a front end
// lets through would fail later (or one the engine takes would be refused).
#include "cpu_offload/option_names.h"

#include <gtest/gtest.h>

#include "cpu_offload/check.h"
#include "cpu_offload/offload_config.h"
#include "cpu_offload/transfer_engine.h"

namespace omni::offload {
namespace {

template <typename Parse>
void expect_round_trip(const std::vector<std::string>& listed, Parse parse) {
  ASSERT_FALSE(listed.empty());
  for (const auto& name : listed) {
    SCOPED_TRACE(name);
    EXPECT_EQ(to_string(parse(name)), name);
  }
}

TEST(OptionNames, EveryListedNameParsesBackToItself) {
  expect_round_trip(names::component_policies(), parse_component_policy);
  expect_round_trip(names::expert_miss_policies(), parse_expert_miss_policy);
  expect_round_trip(names::expert_evictions(), parse_expert_eviction);
  expect_round_trip(names::disk_reads(), parse_disk_read);
  for (const auto& name : names::device_kinds()) {
    SCOPED_TRACE(name);
    // "auto" parses to what it resolves to on this machine.
    EXPECT_EQ(to_string(parse_device_kind(name)), name == "auto" ? resolve_device(name) : name);
  }
}

// `--device auto` (every command's default) is CUDA exactly when this build has the CUDA
// engine and a device is usable: a GPU user who gives no --device does not run on the host.
TEST(OptionNames, AutoDeviceIsCudaExactlyWhenACudaDeviceIsUsable) {
  std::string why;
  const std::string device = resolve_device("auto", &why);
  EXPECT_EQ(device, cuda_engine_built() && cuda_device_count() > 0 ? "cuda" : "cpu");
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(resolve_device("cpu"), "cpu");
  EXPECT_EQ(resolve_device("cuda"), "cuda");
}

TEST(OptionNames, TheDefaultsComeFirst) {
  const OffloadConfig defaults;
  EXPECT_EQ(names::component_policies().front(), to_string(defaults.component_policy));
  EXPECT_EQ(names::expert_miss_policies().front(), to_string(defaults.expert_miss_policy));
  EXPECT_EQ(names::expert_evictions().front(), to_string(defaults.expert_eviction));
  EXPECT_EQ(names::disk_reads().front(), to_string(defaults.disk_read));
}

TEST(OptionNames, AnUnknownNameIsRefusedWithTheList) {
  try {
    parse_expert_eviction("fifo");
    FAIL() << "fifo parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fifo' (expected layer or lru)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(names::listed({"a"}), "a");
  EXPECT_EQ(names::listed({"a", "b", "c"}), "a, b or c");
}

}  // namespace
}  // namespace omni::offload
