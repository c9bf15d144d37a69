// Typed values of the stage config's keys, read from YAML, JSON or a flag, with the ranges and
// messages every source shares.
#include "worker/config/stage_values.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "cpu_offload/option_names.h"
#include "cpu_offload/option_values.h"

namespace omni::config::detail {
namespace {

namespace fs = std::filesystem;
using Kind = RawValue::Kind;

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

std::string describe(const RawValue& v) {
  switch (v.kind) {
    case Kind::kNull:
      return "nothing";
    case Kind::kSequence:
      return "a list";
    case Kind::kMapping:
      return "a mapping";
    case Kind::kScalar:
      break;
  }
  return v.quoted ? "the string \"" + v.text + "\"" : "'" + v.text + "'";
}

[[noreturn]] void wrong_type(const std::string& key, const RawValue& v, const std::string& what) {
  fail(v.where, key + ": expected " + what + ", got " + describe(v));
}

}  // namespace

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool to_bool(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const std::string s = lower(v.text);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  wrong_type(key, v, "a boolean (true or false)");
}

int64_t to_int(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (begin != end && *begin == '+') ++begin;
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc::result_out_of_range)
      fail(v.where, key + ": " + v.text + " is out of range");
    if (ec == std::errc() && ptr == end && begin != end) return value;
  }
  wrong_type(key, v, "an integer");
}

uint64_t to_uint(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted && !v.text.empty() && v.text[0] != '-') {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (*begin == '+') ++begin;
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc::result_out_of_range)
      fail(v.where, key + ": " + v.text + " is out of range");
    if (ec == std::errc() && ptr == end && begin != end) return value;
  }
  if (v.kind == Kind::kScalar && !v.quoted) {
    int64_t negative = to_int(key, v);  // an integer below zero, or the type error
    fail(v.where, key + " must be >= 0, got " + std::to_string(negative));
  }
  wrong_type(key, v, "a non-negative integer");
}

double to_double(const std::string& key, const RawValue& v) {
  if (v.kind == Kind::kScalar && !v.quoted) {
    const char* begin = v.text.data();
    const char* end = begin + v.text.size();
    if (begin != end && *begin == '+') ++begin;
    double value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end && begin != end && std::isfinite(value)) return value;
  }
  wrong_type(key, v, "a number");
}

std::string to_string(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a string");
  return v.text;
}

std::vector<int64_t> to_int_list(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kSequence) wrong_type(key, v, "a list of integers, e.g. [0]");
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(to_int(key, item));
  return out;
}

// A list of strings, or one string of comma-separated names.
std::vector<std::string> to_string_list(const std::string& key, const RawValue& v) {
  std::vector<std::string> out;
  if (v.kind == Kind::kSequence) {
    for (const auto& item : v.items) {
      std::string s = trim(to_string(key, item));
      if (s.empty()) fail(item.where, key + ": an empty name");
      out.push_back(s);
    }
    return out;
  }
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a list of strings");
  std::stringstream in(v.text);
  for (std::string part; std::getline(in, part, ',');) {
    part = trim(part);
    if (part.empty()) fail(v.where, key + ": an empty name in '" + v.text + "'");
    out.push_back(part);
  }
  return out;
}

std::string one_of(const std::string& key, const RawValue& v,
                   const std::vector<std::string>& valid) {
  std::string s = to_string(key, v);
  if (contains(valid, s)) return s;
  std::string message = key + ": unknown value '" + s + "'";
  const std::string close = detail::closest_match(s, valid);
  if (!close.empty()) message += "; did you mean '" + close + "'?";
  fail(v.where, message + " (valid: " + join(valid) + ")");
}

std::string to_dtype(const std::string& key, const RawValue& v) {
  const std::string given = trim(to_string(key, v));
  try {
    const std::string name = offload::values::canonical_dtype(given);
    return name == "auto" ? "" : name;
  } catch (const std::invalid_argument&) {
    RawValue named = v;
    named.text = lower(given);
    return one_of(key, named, offload::values::dtype_names());  // fails with the suggestion
  }
}

std::string to_devices(const std::string& key, const RawValue& v) {
  std::string s = trim(to_string(key, v));
  bool ok = !s.empty();
  if (s != "cpu") {
    std::stringstream in(s);
    for (std::string part; ok && std::getline(in, part, ',');) {
      part = trim(part);
      ok = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
    }
    ok = ok && s.back() != ',';
  }
  if (!ok) {
    fail(v.where,
         key + ": expected \"cpu\" or device indices such as \"0\" or \"0,1\", got " + describe(v));
  }
  return s;
}

std::string to_address(const std::string& key, const RawValue& v) {
  std::string s = trim(to_string(key, v));
  if (s.empty()) return s;
  const auto colon = s.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < s.size();
  if (ok) {
    const std::string port = s.substr(colon + 1);
    ok = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c));
         });
    ok = ok && std::stoi(port) >= 1 && std::stoi(port) <= 65535;
  }
  if (!ok) fail(v.where, key + ": expected \"host:port\" (port 1-65535), got " + describe(v));
  return s;
}

std::string to_model_dir(const std::string& key, const RawValue& v, const SetContext& context) {
  const std::string given = trim(to_string(key, v));
  if (given.empty()) fail(v.where, key + ": empty (the checkpoint directory)");
  fs::path path(given);
  if (path.is_relative()) path = fs::path(context.base_dir) / path;
  path = fs::absolute(path).lexically_normal();
  if (path.has_parent_path() && path.filename().empty()) path = path.parent_path();
  std::string resolved = path.string();
  if (context.check_model_dirs) {
    std::error_code ec;
    const std::string from = fs::path(given).is_relative()
                                 ? " ('" + given + "' resolved against '" + context.base_dir + "')"
                                 : "";
    if (!fs::exists(path, ec)) {
      fail(v.where, key + ": the directory '" + resolved + "' does not exist" + from);
    }
    if (!fs::is_directory(path, ec)) {
      fail(v.where, key + ": '" + resolved + "' is not a directory" + from);
    }
  }
  return resolved;
}

uint64_t to_byte_size(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) wrong_type(key, v, "a byte size (an integer or e.g. \"20GiB\")");
  try {
    return offload::values::parse_byte_size(v.text);
  } catch (const std::invalid_argument& e) {
    fail(v.where, key + ": " + e.what());
  }
}

// "25%" (of all experts' bytes, in (0, 100]) as is; a byte size as its decimal bytes.
std::string to_expert_budget(const std::string& key, const RawValue& v) {
  if (v.kind != Kind::kScalar) {
    wrong_type(key, v, "a percentage of the experts' bytes (\"25%\") or a byte size");
  }
  std::string text = trim(v.text);
  if (!text.empty() && text.back() == '%') {
    double percent = 0;
    size_t used = 0;
    try {
      percent = std::stod(text.substr(0, text.size() - 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() - 1 || !(percent > 0 && percent <= 100)) {
      fail(v.where, key + ": '" + text + "' must be a percentage in (0%, 100%]");
    }
    return text;
  }
  const uint64_t bytes = to_byte_size(key, v);
  if (bytes == 0) fail(v.where, key + ": 0 bytes (give a percentage such as 25%, or bytes)");
  return std::to_string(bytes);
}

}  // namespace omni::config::detail
