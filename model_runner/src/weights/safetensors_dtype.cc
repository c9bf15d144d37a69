#include "safetensors_dtype.h"

#include <utility>

namespace omni::models::detail {
namespace {

// The subset of the format's dtypes that LibTorch has scalar types for. The format also has
// U16/U32/U64 and the F6/F4 variants; no Hugging Face model we load stores them.
constexpr std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"F64", at::kDouble},
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
};

}  // namespace

std::optional<at::ScalarType> safetensors_to_dtype(const std::string& name) {
  for (const auto& [str, dtype] : kDtypes) {
    if (name == str) return dtype;
  }
  return std::nullopt;
}

const char* dtype_to_safetensors(at::ScalarType dtype) {
  for (const auto& [str, type] : kDtypes) {
    if (type == dtype) return str;
  }
  return nullptr;
}

std::string supported_safetensors_dtypes() {
  std::string out;
  for (const auto& [str, dtype] : kDtypes) out += (out.empty() ? "" : ", ") + std::string(str);
  return out;
}

}  // namespace omni::models::detail
