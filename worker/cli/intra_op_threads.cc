#include "worker/cli/intra_op_threads.h"

#include <ATen/Parallel.h>

#include <cstdlib>

namespace omni::cli {

int default_intra_op_threads() {
  if (std::getenv("OMP_NUM_THREADS") == nullptr) at::set_num_threads(1);
  return at::get_num_threads();
}

}  // namespace omni::cli
