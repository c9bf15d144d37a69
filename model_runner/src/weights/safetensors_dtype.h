// The safetensors dtype strings and their LibTorch scalar types, shared by reader and writer.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace omni::models::detail {

// std::nullopt for a string the format does not define (or that LibTorch cannot represent).
std::optional<at::ScalarType> safetensors_to_dtype(const std::string& name);
// nullptr for a scalar type safetensors cannot store (complex, quantized, ...).
const char* dtype_to_safetensors(at::ScalarType dtype);
// "F64, F32, ...": for error messages.
std::string supported_safetensors_dtypes();

}  // namespace omni::models::detail
