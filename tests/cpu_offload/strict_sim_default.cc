// Linked into every engine test binary: the simulated devices these suites create without
// choosing run in strict mode (CUDA's ordering rules enforced, cpu_offload/src/sim_device_rules.h),
// unless OMNI_SIM_STRICT is already set (OMNI_SIM_STRICT=0 runs them relaxed).
#include <cstdlib>

namespace {
// Before main(): engines read the variable when they are made.
[[maybe_unused]] const int kStrictUnlessSet = setenv("OMNI_SIM_STRICT", "1", /*overwrite=*/0);
}  // namespace
