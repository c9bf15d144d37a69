#include "worker/rpc/grpc_runtime.h"

#include <grpc/grpc.h>

#include <mutex>

namespace omni::rpc {

void keep_grpc_initialized() {
  static std::once_flag once;
  std::call_once(once, [] { grpc_init(); });  // deliberately never paired with grpc_shutdown
}

}  // namespace omni::rpc
