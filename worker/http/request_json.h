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

// The body as JSON, refused (400 invalid_json / invalid_value) when it is not JSON or nests
// deeper than `max_depth`.
nlohmann::json parse_body(std::string_view body, size_t max_depth);

}  // namespace omni::http::detail
