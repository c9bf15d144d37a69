// Linked instead of transfer_engine_cuda.cc when the build has no CUDA.
#include "cpu_offload/check.h"
#include "cpu_offload/transfer_engine.h"

namespace omni::offload {

bool cuda_engine_built() { return false; }

int cuda_device_count() { return 0; }

std::shared_ptr<TransferEngine> make_cuda_engine(const TransferEngineOptions& /*options*/) {
  OMNI_THROW(
      "device 'cuda' requested but this build has no CUDA transfer engine (configure with "
      "-DOMNI_WITH_CUDA=ON on a machine with the CUDA toolkit and a CUDA torch wheel)");
}

}  // namespace omni::offload
