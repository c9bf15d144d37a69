// A build without the server parts (no gRPC / yaml-cpp): no stage workers.
#include "cpu_offload/check.h"
#include "worker/cli/generate_backend.h"

namespace omni::cli {

std::unique_ptr<GenerateBackend> make_pipeline_backend(const GenerateOptions&) {
  throw omni::Error(
      "--stage-configs-path needs the stage workers, and this build has none (configured "
      "without gRPC and yaml-cpp: run scripts/setup.sh and rebuild)");
}

}  // namespace omni::cli
