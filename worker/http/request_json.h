// Reading an OpenAI request body: the JSON parsed under a depth limit, typed access to its
// fields, and the errors that name the field ("messages[1].content[0].type") with an OpenAI
// error code. Shared by the request parser and the media reader; not an API.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "worker/http/api_error.h"

namespace omni::http::detail {

// Each throws ApiException with a 400 naming `param`.
[[noreturn]] void fail(const std::string& param, std::string message, std::string code);
[[noreturn]] void wrong_type(const std::string& param, const std::string& expected,
                             const nlohmann::json& got);
[[noreturn]] void invalid_value(const std::string& param, const std::string& why);
[[noreturn]] void unsupported(const std::string& param, const std::string& why);
// A value from the request, quoted for a message and cut when long.
std::string quote_value(std::string_view value);
// A bound for a message: 100, 0.5, 1e+30.
std::string format_number(double x);
// "a string", "an integer", ...
const char* type_of(const nlohmann::json& v);

// "a.b", "a[2]" (a top-level key alone when `parent` is empty).
std::string join_path(const std::string& parent, const std::string& key);
std::string index_path(const std::string& parent, size_t i);
// The member `key` of `object`, or null.
const nlohmann::json* field(const nlohmann::json& object, const char* key);
// Refuses a member of `object` that is not among `known`.
void check_keys(const nlohmann::json& object, const std::string& path,
                std::initializer_list<const char*> known);
const std::string& get_string(const nlohmann::json& v, const std::string& param);
bool get_bool(const nlohmann::json& v, const std::string& param);
double get_number(const nlohmann::json& v, const std::string& param);
int64_t get_int(const nlohmann::json& v, const std::string& param);
uint64_t get_seed(const nlohmann::json& v, const std::string& param);
// A string of at most `max_bytes` (a prompt); otherwise 400 invalid_value saying its size.
const std::string& get_text(const nlohmann::json& v, const std::string& param, size_t max_bytes);
// An integer (a number) from lo to hi; otherwise 400 invalid_value saying the range.
int64_t get_int_in(const nlohmann::json& v, const std::string& param, int64_t lo, int64_t hi);
double get_number_in(const nlohmann::json& v, const std::string& param, double lo, double hi);

// "832x480": width 832, height 480, each from 2 to `max_side`; otherwise 400 invalid_value
// naming `param` (the message shows `example`).
struct ImageSize {
  int64_t width = 0, height = 0;
};
ImageSize parse_size(const std::string& s, const std::string& param, int64_t max_side,
                     const char* example);

// What a body may hold, checked before and while it is parsed.
struct BodyLimits {
  size_t max_depth = 32;
  // Values the parser may make (keys count), bounded from above by the byte scan before the
  // parser runs: a body of "{}," repeated costs ~30 bytes of memory per byte as a DOM.
  size_t max_values = 65536;
  // String values under these keys (in any object) are text; their bytes together (as decoded
  // UTF-8) may not pass max_text_bytes (0: no limit). Checked by the byte scan, before the
  // parser copies a megabyte string twice.
  std::vector<std::string> text_keys;
  size_t max_text_bytes = 0;
  std::string text_param;  // the field the error names ("messages")
  std::string text_why;    // what sets the limit ("the model's context of 4096 tokens")
};

// The body as JSON. Refused with 400 invalid_json when it is not JSON or nests deeper than
// max_depth, 413 request_too_large past max_values, 400 context_length_exceeded past
// max_text_bytes. `values` gets the scan's bound of the values it made.
nlohmann::json parse_body(std::string_view body, const BodyLimits& limits,
                          size_t* values = nullptr);

// What one parsed JSON value costs in memory beside its string bytes (nlohmann's 16-byte value,
// the node or slot that holds it, the allocator's overhead): a budget's estimate.
constexpr size_t kJsonValueBytes = 64;

}  // namespace omni::http::detail
