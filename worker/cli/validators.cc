#include "worker/cli/validators.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "cpu_offload/option_values.h"

namespace omni::cli {
namespace {

bool parse_integer(const std::string& text, long long* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

bool parse_number(const std::string& text, double* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return errno == 0 && end == text.c_str() + text.size() && std::isfinite(*value);
}

}  // namespace

CLI::Validator integer_at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long long v;
        if (!parse_integer(text, &v) || v < min) {
          return "expected an integer >= " + std::to_string(min) + ", got '" + text + "'";
        }
        return "";
      },
      "");
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // Digits only: strtoull would accept "-1" (and wrap it around).
        const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
        errno = 0;
        if (!digits || (std::strtoull(text.c_str(), nullptr, 10) == ULLONG_MAX && errno != 0)) {
          return "expected an unsigned 64-bit integer, got '" + text + "'";
        }
        return "";
      },
      "");
}

CLI::Validator number_in(double min, double max, bool min_open) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v;
        const bool ok = parse_number(text, &v) && (min_open ? v > min : v >= min) && v <= max;
        if (ok) return "";
        std::ostringstream why;
        why << "expected a number ";
        if (max == HUGE_VAL) {
          why << (min_open ? "> " : ">= ") << min;
        } else {
          why << "in " << (min_open ? "(" : "[") << min << ", " << max << "]";
        }
        why << ", got '" << text << "'";
        return why.str();
      },
      "");
}

CLI::Validator positive_byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t bytes = 0;
        try {
          bytes = offload::values::parse_byte_size(text);
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        if (bytes == 0) return "expected a byte size above 0, got '" + text + "'";
        text = std::to_string(bytes);
        return "";
      },
      "");
}

CLI::Validator one_of(const std::vector<std::string>& names) {
  return CLI::Validator(
      [names](std::string& text) -> std::string {
        if (std::find(names.begin(), names.end(), text) != names.end()) return "";
        std::string list;
        for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
        return "expected one of " + list + "; got '" + text + "'";
      },
      "");
}

}  // namespace omni::cli
