#include "worker/http/api_error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <utility>

namespace omni::http {
namespace {

ApiError make(int status, std::string type, std::string message, std::string param,
              std::string code) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

}  // namespace

std::string ApiError::json() const {
  using nlohmann::json;
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", std::move(error)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' ||
         c == '-';
}

// The length of a source location "[name.cc:123]" at `pos` (with a C++ file extension when
// `source_only`), or 0.
size_t location_at(const std::string& s, size_t pos, bool source_only) {
  if (pos >= s.size() || s[pos] != '[') return 0;
  size_t i = pos + 1;
  while (i < s.size() && is_name_char(s[i])) ++i;
  const std::string name = s.substr(pos + 1, i - pos - 1);
  if (name.empty() || i >= s.size() || s[i] != ':') return 0;
  const size_t digits = ++i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == digits || i >= s.size() || s[i] != ']') return 0;
  if (source_only) {
    const size_t dot = name.rfind('.');
    const std::string ext = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (ext != "cc" && ext != "cpp" && ext != "h" && ext != "hpp") return 0;
  }
  return i + 1 - pos;
}

// The length of "omni-media-Ab12Cd/" (or the mp4 encoder's or the video jobs' folder) at `pos`,
// or 0: mkdtemp's six characters, then a slash.
size_t temp_folder_at(const std::string& s, size_t pos) {
  for (const char* prefix : {"omni-media-", "omni-mp4-", "omni-videos-"}) {
    const size_t n = std::char_traits<char>::length(prefix);
    if (s.compare(pos, n, prefix) != 0 || pos + n + 7 > s.size() || s[pos + n + 6] != '/') {
      continue;
    }
    const auto first = s.begin() + static_cast<std::ptrdiff_t>(pos + n);
    if (std::all_of(first, first + 6,
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; })) {
      return n + 7;
    }
  }
  return 0;
}

}  // namespace

std::string public_error_message(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size();) {
    // " (expected <condition>) [file.cc:12]": the condition may hold parentheses, so it ends
    // where a location follows.
    if (message.compare(i, 11, " (expected ") == 0) {
      size_t close = message.find(") [", i);
      while (close != std::string::npos && location_at(message, close + 2, false) == 0) {
        close = message.find(") [", close + 1);
      }
      if (close != std::string::npos) {
        i = close + 2 + location_at(message, close + 2, false);
        continue;
      }
    }
    if (message[i] == ' ') {
      if (const size_t n = location_at(message, i + 1, true)) {
        i += 1 + n;
        continue;
      }
    }
    // ".../omni-media-Ab12Cd/": a temporary folder of the server's, up to the file name.
    if (const size_t n = temp_folder_at(message, i)) {
      const size_t delimiter = out.find_last_of(" '\"");
      out.erase(delimiter == std::string::npos ? 0 : delimiter + 1);
      i += n;
      continue;
    }
    out += message[i++];
  }
  return out;
}

ApiException::ApiException(ApiError e) : error_(std::move(e)) {}

ApiError api_error(int status, std::string type, std::string code, std::string message,
                   std::string param) {
  return make(status, std::move(type), std::move(message), std::move(param), std::move(code));
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return make(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

ApiError request_too_large(std::string message, std::string param) {
  return make(413, "invalid_request_error", std::move(message), std::move(param),
              "request_too_large");
}

ApiError media_too_large(std::string message, std::string param) {
  return make(400, "invalid_request_error", std::move(message), std::move(param),
              "media_too_large");
}

ApiError unauthorized(std::string message) {
  return make(401, "authentication_error", std::move(message), "", "invalid_api_key");
}

ApiError model_not_found(std::string message) {
  return make(404, "not_found_error", std::move(message), "model", "model_not_found");
}

ApiError rate_limited(std::string message) {
  return make(429, "rate_limit_error", std::move(message), "", "");
}

ApiError server_error(std::string message) {
  return make(500, "server_error", std::move(message), "", "");
}

}  // namespace omni::http
