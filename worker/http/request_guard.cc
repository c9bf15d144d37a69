#include "worker/http/request_guard.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "worker/http/ascii_text.h"

namespace omni::http {
namespace {

// "[::1]:8091" -> "[::1]", "Example.COM.:80" -> "example.com".
std::string host_name(const std::string& host_header) {
  std::string h = ascii_lower(trim_blanks(host_header));
  if (!h.empty() && h.front() == '[') {
    const auto close = h.find(']');
    h = close == std::string::npos ? h : h.substr(0, close + 1);
  } else if (const auto colon = h.rfind(':'); colon != std::string::npos) {
    h = h.substr(0, colon);
  }
  if (h.size() > 1 && h.back() == '.') h.pop_back();
  return h;
}

// A Content-Length value: decimal digits that fit 63 bits.
std::optional<uint64_t> content_length(const std::string& value) {
  const std::string v = trim_blanks(value);
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoull(v);
}

bool is_loopback(const std::string& host) {
  const std::string h = ascii_lower(host);
  return h == "localhost" || h == "::1" || h == "[::1]" || h.rfind("127.", 0) == 0;
}

ApiError refusal(int status, std::string code, std::string message) {
  ApiError e;
  e.status = status;
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

}  // namespace

HostPolicy host_policy(const std::string& listen_host, bool has_api_key,
                       const std::vector<std::string>& allowed_hosts) {
  HostPolicy policy;
  const bool any =
      std::find(allowed_hosts.begin(), allowed_hosts.end(), "*") != allowed_hosts.end();
  if (any || (allowed_hosts.empty() && (has_api_key || !is_loopback(listen_host)))) {
    return policy;
  }
  policy.allowed = {"localhost", "127.0.0.1", "[::1]"};
  std::string listen = listen_host;
  if (listen.find(':') != std::string::npos && listen.front() != '[') listen = "[" + listen + "]";
  if (!listen.empty()) policy.allowed.push_back(host_name(listen));
  for (const auto& h : allowed_hosts) policy.allowed.push_back(host_name(h));
  return policy;
}

RequestHead request_head_of(const HttpHead& head) {
  RequestHead out;
  out.method = head.method;
  out.path = head.path();
  out.header_values = [&head](const std::string& name) { return head.values(name); };
  return out;
}

std::optional<ApiError> refuse_request_head(const RequestHead& head, const HostPolicy& hosts) {
  const auto lengths = head.header_values("Content-Length");
  const auto transfer = head.header_values("Transfer-Encoding");
  if (!transfer.empty() && !lengths.empty()) {
    return refusal(400, "invalid_framing",
                   "the request has both Content-Length and Transfer-Encoding: send one");
  }
  for (const auto& length : lengths) {
    if (trim_blanks(length) != trim_blanks(lengths.front())) {
      return refusal(400, "invalid_framing", "the request has Content-Lengths that differ");
    }
    if (!content_length(length)) {
      return refusal(400, "invalid_framing", "the request's Content-Length is not a number");
    }
  }
  if (!transfer.empty()) {
    // The body limit counts bytes as announced: a chunked body announces none.
    return refusal(411, "length_required",
                   "chunked request bodies are not accepted: send the body with Content-Length");
  }
  if (lengths.empty() &&
      (head.method == "POST" || head.method == "PUT" || head.method == "PATCH")) {
    return refusal(411, "length_required",
                   "a " + head.method + " request needs a Content-Length header (0 for no body)");
  }
  for (const auto& encoding : head.header_values("Content-Encoding")) {
    const std::string e = ascii_lower(trim_blanks(encoding));
    if (!e.empty() && e != "identity") {
      // A compressed body would be inflated in memory before any limit applies.
      return refusal(415, "unsupported_content_encoding",
                     "compressed request bodies (Content-Encoding) are not accepted: send the "
                     "JSON uncompressed");
    }
  }
  if (head.method == "POST") {
    const auto types = head.header_values("Content-Type");
    const std::string type =
        types.empty() ? ""
                      : ascii_lower(trim_blanks(types.front().substr(0, types.front().find(';'))));
    const bool form_route = takes_form(head);
    const bool form =
        type == "multipart/form-data" && form_route && !head.header_values("Authorization").empty();
    if (type != "application/json" && !form) {
      if (type == "multipart/form-data" && form_route) {
        return refusal(415, "unsupported_media_type",
                       "a multipart/form-data request needs an Authorization header (the bearer "
                       "key; any value on a server without one)");
      }
      // Browsers send forms and text/plain across sites without asking: JSON only.
      return refusal(415, "unsupported_media_type",
                     "the request body must be JSON, sent with Content-Type: application/json");
    }
  }
  if (!hosts.allowed.empty()) {
    const auto host_values = head.header_values("Host");
    const std::string host = host_values.empty() ? "" : host_name(host_values.front());
    if (!host.empty() &&
        std::find(hosts.allowed.begin(), hosts.allowed.end(), host) == hosts.allowed.end()) {
      return refusal(403, "host_not_allowed",
                     "this server does not answer to the Host name in the request: add it with "
                     "--allowed-hosts");
    }
  }
  return std::nullopt;
}

bool is_public_route(const RequestHead& head, const AccessPolicy& access) {
  const bool get = head.method == "GET" || head.method == "HEAD";
  return head.method == "OPTIONS" || (get && (head.path == "/health" || head.path == "/")) ||
         (get && head.path == "/metrics" && access.metrics_public);
}

bool takes_body(const RequestHead& head) {
  return head.method == "POST" &&
         (head.path == "/v1/chat/completions" || head.path == "/v1/videos" ||
          head.path == "/v1/videos/sync" || head.path == "/v1/images/generations" ||
          head.path == "/v1/images/edits");
}

bool takes_form(const RequestHead& head) {
  return head.method == "POST" && (head.path == "/v1/videos" || head.path == "/v1/videos/sync" ||
                                   head.path == "/v1/images/edits");
}

bool key_matches(const std::string& authorization, const std::string& api_key) {
  const std::string expected = "Bearer " + api_key;
  if (authorization.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(authorization[i] ^ expected[i]);
  }
  return diff == 0;
}

std::optional<ApiError> refuse_request_access(const RequestHead& head, const AccessPolicy& access) {
  if (!access.api_key.empty() && !is_public_route(head, access)) {
    const auto values = head.header_values("Authorization");
    if (values.size() != 1 || !key_matches(values.front(), access.api_key)) {
      ApiError e = unauthorized(values.empty() ? "no API key: send 'Authorization: Bearer <key>'"
                                               : "the API key is wrong");
      return e;
    }
  }
  const auto lengths = head.header_values("Content-Length");
  const uint64_t length = lengths.empty() ? 0 : content_length(lengths.front()).value_or(0);
  // Other routes may carry an empty JSON object or so; never a body worth buffering.
  constexpr uint64_t kSmallBody = 4096;
  if (!takes_body(head) && length > kSmallBody) {
    return refusal(413, "request_too_large",
                   head.method + " " + (head.path.size() <= 64 ? head.path : "this route") +
                       " takes no request body (Content-Length " + std::to_string(length) + ")");
  }
  if (length > access.max_body_bytes) {
    return refusal(413, "request_too_large",
                   "the request body (Content-Length " + std::to_string(length) +
                       ") is larger than --max-request-bytes (" +
                       std::to_string(access.max_body_bytes) + " bytes)");
  }
  return std::nullopt;
}

bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed_origins) {
  if (origin.empty()) return false;
  const std::string wanted = ascii_lower(origin);
  return std::any_of(allowed_origins.begin(), allowed_origins.end(),
                     [&](const std::string& o) { return o == "*" || ascii_lower(o) == wanted; });
}

}  // namespace omni::http
