// LibTorch's intra-op threads for a vllm-omni process: one, unless OMP_NUM_THREADS is set. The
// stages' engine loops already run side by side, each on many
// small ops; a thread team per op only takes cores from them.
#pragma once

namespace omni::cli {

// Sets LibTorch's intra-op threads to 1 when the environment has no OMP_NUM_THREADS; leaves them
// as they are otherwise. Call before the first model op and before the stages' threads start.
// Returns the intra-op thread count now in force.
int default_intra_op_threads();

}  // namespace omni::cli
