#include "worker/http/request_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace omni::http::detail {

using nlohmann::json;

// --- errors -------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& param, std::string message, std::string code) {
  throw ApiException(bad_request(std::move(message), param, std::move(code)));
}

// A value from the request, quoted for a message: long values are cut (a message must not echo
// megabytes back).
std::string quote_value(std::string_view value) {
  constexpr size_t kMax = 64;
  if (value.size() <= kMax) return "'" + std::string(value) + "'";
  return "'" + std::string(value.substr(0, kMax)) + "...'";
}

std::string format_number(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

const char* type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unknown value";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const std::string& expected,
                             const json& got) {
  const std::string what = param.empty() ? "the request body" : "'" + param + "'";
  fail(param, "invalid type for " + what + ": expected " + expected + ", got " + type_of(got),
       "invalid_type");
}

[[noreturn]] void invalid_value(const std::string& param, const std::string& why) {
  fail(param, "invalid value for '" + param + "': " + why, "invalid_value");
}

[[noreturn]] void unsupported(const std::string& param, const std::string& why) {
  fail(param, why, "unsupported");
}

// --- JSON access --------------------------------------------------------------------------

std::string join_path(const std::string& parent, const std::string& key) {
  // A key comes from the request: an unknown one of a megabyte must not be echoed whole.
  constexpr size_t kMaxKey = 64;
  const std::string shown = key.size() <= kMaxKey ? key : key.substr(0, kMaxKey) + "...";
  return parent.empty() ? shown : parent + "." + shown;
}
std::string index_path(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

// The field, or nullptr when it is absent or null (clients send null for "not set").
const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// Rejects keys outside `known` with code unknown_field.
void check_keys(const json& object, const std::string& path,
                std::initializer_list<const char*> known) {
  for (const auto& item : object.items()) {
    const bool ok =
        std::any_of(known.begin(), known.end(), [&](const char* k) { return item.key() == k; });
    if (!ok) {
      fail(join_path(path, item.key()),
           "unknown field " + quote_value(item.key()) + (path.empty() ? "" : " in '" + path + "'"),
           "unknown_field");
    }
  }
}

const std::string& get_string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

double get_number(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x)) invalid_value(param, "must be a finite number");
  return x;
}

// An integer, also written as a float without fraction (1.0, 1e3), as Python clients may.
int64_t get_int(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      invalid_value(param, "out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(param, "an integer", v);
    // [-2^63, 2^63): both bounds are exact doubles.
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
      invalid_value(param, "out of range");
    }
    return static_cast<int64_t>(d);
  }
  wrong_type(param, "an integer", v);
}

uint64_t get_seed(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) invalid_value(param, "must be >= 0");
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(param, "an integer", v);
    if (d < 0) invalid_value(param, "must be >= 0");
    if (d >= 18446744073709551616.0) invalid_value(param, "out of range");  // 2^64
    return static_cast<uint64_t>(d);
  }
  wrong_type(param, "an integer", v);
}

const std::string& get_text(const json& v, const std::string& param, size_t max_bytes) {
  const std::string& s = get_string(v, param);
  if (s.size() > max_bytes) {
    invalid_value(param, "is " + std::to_string(s.size()) + " bytes, at most " +
                             std::to_string(max_bytes) + " are accepted");
  }
  return s;
}

int64_t get_int_in(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  const int64_t n = get_int(v, param);
  if (n < lo || n > hi) {
    invalid_value(param, "must be from " + std::to_string(lo) + " to " + std::to_string(hi) +
                             ", got " + std::to_string(n));
  }
  return n;
}

double get_number_in(const json& v, const std::string& param, double lo, double hi) {
  const double d = get_number(v, param);
  if (!(d >= lo && d <= hi)) {
    invalid_value(param, "must be from " + format_number(lo) + " to " + format_number(hi));
  }
  return d;
}

ImageSize parse_size(const std::string& s, const std::string& param, int64_t max_side,
                     const char* example) {
  const auto bad = [&] {
    invalid_value(param, "must be \"WIDTHxHEIGHT\" (e.g. \"" + std::string(example) + "\"), got " +
                             quote_value(s));
  };
  const auto x = s.find('x');
  if (x == std::string::npos || x == 0 || x + 1 == s.size() || s.size() > 16) bad();
  int64_t side[2] = {0, 0};
  const std::string parts[2] = {s.substr(0, x), s.substr(x + 1)};
  for (int i = 0; i < 2; ++i) {
    for (const char c : parts[i]) {
      if (c < '0' || c > '9') bad();
    }
    side[i] = std::strtoll(parts[i].c_str(), nullptr, 10);
    if (side[i] < 2 || side[i] > max_side) {
      invalid_value(param, "width and height must be from 2 to " + std::to_string(max_side) +
                               ", got " + quote_value(s));
    }
  }
  return {side[0], side[1]};
}

// --- the body -----------------------------------------------------------------------------

namespace {

// The decoded UTF-8 length of the JSON string literal body[begin, end) (between its quotes).
size_t decoded_length(std::string_view body, size_t begin, size_t end) {
  const auto hex = [&](size_t at) {
    unsigned v = 0;
    for (size_t k = at; k < at + 4 && k < end; ++k) {
      const char c = body[k];
      v = v * 16 + static_cast<unsigned>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  };
  size_t n = 0;
  for (size_t i = begin; i < end; ++i) {
    if (body[i] != '\\') {
      ++n;
    } else if (i + 1 < end && body[i + 1] == 'u') {
      const unsigned cp = hex(i + 2);
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        n += 4;   // a surrogate pair: one 4-byte character
        i += 11;  // this escape and the next
      } else {
        n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
        i += 5;
      }
    } else {
      ++n;
      ++i;
    }
  }
  return n;
}

// Before the parser: nlohmann's parser and destructor keep heap stacks, but copying or dumping a
// value recurses, and building a DOM 100000 levels deep is wasted work anyway; and a text field
// of 48 MB costs three copies once parsed. So a byte scan that tracks strings exactly as JSON
// does (it agrees with the parser on every prefix the parser accepts) refuses bodies nested
// deeper than any request can be, and sums the text under the text keys.
// Returns an upper bound of the values (keys included) the parser would make: every value but
// the first of a container follows a comma, every member's value a colon, so two per container
// plus the commas and colons bound them (a parser callback that counted instead makes nlohmann
// 3.11 quadratic in the elements of an array).
size_t scan_body(std::string_view body, const BodyLimits& limits) {
  struct Frame {
    bool object = false;
    bool expect_key = false;  // object: the next string is a key
    bool text_value = false;  // object: the last key is a text key
  };
  std::vector<Frame> frames;
  size_t text = 0, values = 1;
  const auto count = [&] {
    if (++values > limits.max_values) {
      throw ApiException(request_too_large("the request body holds more than " +
                                           std::to_string(limits.max_values) +
                                           " JSON values (keys included)"));
    }
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '"') {
      const size_t begin = i + 1;
      for (++i; i < body.size() && body[i] != '"'; ++i) {
        if (body[i] == '\\') ++i;
      }
      if (frames.empty() || i >= body.size()) continue;  // the parser refuses it
      Frame& top = frames.back();
      if (top.object && top.expect_key) {
        const std::string_view key = body.substr(begin, i - begin);
        top.text_value = std::find(limits.text_keys.begin(), limits.text_keys.end(), key) !=
                         limits.text_keys.end();
        top.expect_key = false;
      } else if (top.object && top.text_value && limits.max_text_bytes > 0) {
        text += decoded_length(body, begin, i);
        if (text > limits.max_text_bytes) {
          fail(limits.text_param,
               "the request's text is longer than " + limits.text_why + " can hold (" +
                   std::to_string(limits.max_text_bytes) + " bytes of text at most)",
               "context_length_exceeded");
        }
      }
    } else if (c == '[' || c == '{') {
      if (frames.size() >= limits.max_depth) {
        fail("",
             "the request body nests JSON more than " + std::to_string(limits.max_depth) +
                 " levels deep (at byte " + std::to_string(i) + ")",
             "invalid_json");
      }
      frames.push_back({c == '{', c == '{', false});
      count();
      count();
    } else if (c == ']' || c == '}') {
      if (!frames.empty()) frames.pop_back();
    } else if (c == ',' || c == ':') {
      count();
      if (c == ',' && !frames.empty() && frames.back().object) frames.back().expect_key = true;
    }
  }
  return values;
}

// nlohmann's messages start with "[json.exception.parse_error.101] ": the part after it is for
// people.
std::string without_exception_id(const char* what) {
  const char* p = std::strchr(what, ']');
  std::string s = p != nullptr && what[0] == '[' ? std::string(p + 1) : std::string(what);
  if (!s.empty() && s[0] == ' ') s.erase(0, 1);
  constexpr size_t kMax = 300;  // "last read: '...'" quotes the token, which may be huge
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

}  // namespace

json parse_body(std::string_view body, const BodyLimits& limits, size_t* values) {
  const size_t most = scan_body(body, limits);
  try {
    json parsed = json::parse(body.data(), body.data() + body.size());
    if (values != nullptr) *values = most;
    return parsed;
  } catch (const json::parse_error& e) {
    fail("",
         "the request body is not valid JSON (byte " + std::to_string(e.byte) +
             "): " + without_exception_id(e.what()),
         "invalid_json");
  } catch (const json::out_of_range& e) {
    // 406: a number beyond the range of a double (1e400).
    fail("", "the request body holds a number out of range: " + without_exception_id(e.what()),
         "invalid_value");
  } catch (const json::exception& e) {
    fail("", "the request body is not valid JSON: " + without_exception_id(e.what()),
         "invalid_json");
  }
}

}  // namespace omni::http::detail
