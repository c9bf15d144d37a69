// A dtype name (option_values.h's canonical_dtype: auto, float32, bfloat16, float16 and their
// aliases) as the LibTorch scalar type; Undefined for auto, where a runner takes the checkpoint's.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

#include "cpu_offload/option_values.h"

namespace omni::offload {

// Throws std::invalid_argument for an unknown name.
inline at::ScalarType scalar_type_of(const std::string& dtype) {
  const std::string name = values::canonical_dtype(dtype);
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  return at::ScalarType::Undefined;
}

}  // namespace omni::offload
