// The one parser of each value kind the front ends share (byte sizes, dtype names), for the
// command lines, the stage YAML, --stage-overrides and the benchmarks alike. Standard C++ only:
// the stage config library includes it and builds without LibTorch.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace omni::offload::values {

// "20GiB", "8GB", "1.5 GB", "123" -> bytes. Units (any case): B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024). Throws std::invalid_argument saying why.
inline uint64_t parse_byte_size(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) throw std::invalid_argument("an empty byte size");
  const std::string s = text.substr(first, text.find_last_not_of(" \t") - first + 1);
  const std::string usage =
      " (an integer number of bytes, or a number with a unit: B, KB, MB, GB, TB (powers of "
      "1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 20GiB)";
  if (s[0] == '-') throw std::invalid_argument("a byte size cannot be negative: '" + s + "'");
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string whole = s.substr(0, i);
  std::string fraction;
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    fraction = s.substr(start, i - start);
  }
  if (whole.empty() && fraction.empty()) {
    throw std::invalid_argument("'" + s + "' is not a byte size" + usage);
  }
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  std::string unit = s.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::vector<std::pair<std::string, uint64_t>> kUnits = {
      {"", 1},
      {"b", 1},
      {"kb", 1000ULL},
      {"mb", 1000ULL * 1000},
      {"gb", 1000ULL * 1000 * 1000},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
      {"kib", 1ULL << 10},
      {"mib", 1ULL << 20},
      {"gib", 1ULL << 30},
      {"tib", 1ULL << 40}};
  const auto found =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const auto& u) { return u.first == unit; });
  if (found == kUnits.end()) {
    throw std::invalid_argument("unknown unit '" + s.substr(i) + "' in '" + s + "'" + usage);
  }
  const uint64_t scale = found->second;
  const std::string too_large = "'" + s + "' is too large (at most 2^64 - 1 bytes)";
  uint64_t value = 0;
  for (char c : whole) {
    if (__builtin_mul_overflow(value, 10, &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(c - '0'), &value)) {
      throw std::invalid_argument(too_large);
    }
  }
  if (__builtin_mul_overflow(value, scale, &value)) throw std::invalid_argument(too_large);
  if (!fraction.empty()) {  // the fraction's bytes, rounded to the nearest byte
    const long double part = std::stold("0." + fraction) * static_cast<long double>(scale);
    const long double rounded = std::round(part);
    if (scale == 1 && rounded != part) {
      throw std::invalid_argument("'" + s + "' is not a whole number of bytes");
    }
    if (__builtin_add_overflow(value, static_cast<uint64_t>(rounded), &value)) {
      throw std::invalid_argument(too_large);
    }
  }
  return value;
}

// The compute dtypes by their canonical names; "auto" (the checkpoint's own) first.
inline const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names{"auto", "float32", "bfloat16", "float16"};
  return names;
}

// A dtype name or alias (fp32, float, bf16, fp16, half; any case) -> its canonical name, "auto"
// for auto or "". Throws std::invalid_argument listing the names.
inline std::string canonical_dtype(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (c != ' ' && c != '\t') s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (s.empty() || s == "auto") return "auto";
  if (s == "float32" || s == "float" || s == "fp32") return "float32";
  if (s == "bfloat16" || s == "bf16") return "bfloat16";
  if (s == "float16" || s == "fp16" || s == "half") return "float16";
  throw std::invalid_argument("unknown dtype '" + text +
                              "' (auto, float32, bfloat16, float16; or fp32, bf16, fp16)");
}

}  // namespace omni::offload::values
