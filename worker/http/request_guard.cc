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
  }
  if (!transfer.empty()) {
    // The body limit counts bytes as announced: a chunked body announces none.
    return refusal(411, "length_required",
                   "chunked request bodies are not accepted: send the body with Content-Length");
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
    const bool video_form = type == "multipart/form-data" &&
                            (head.path == "/v1/videos" || head.path == "/v1/videos/sync") &&
                            !head.header_values("Authorization").empty();
    if (type != "application/json" && !video_form) {
      if (type == "multipart/form-data" &&
          (head.path == "/v1/videos" || head.path == "/v1/videos/sync")) {
        return refusal(415, "unsupported_media_type",
                       "a multipart/form-data video request needs an Authorization header (the "
                       "bearer key; any value on a server without one), or send JSON");
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

bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed_origins) {
  if (origin.empty()) return false;
  const std::string wanted = ascii_lower(origin);
  return std::any_of(allowed_origins.begin(), allowed_origins.end(),
                     [&](const std::string& o) { return o == "*" || ascii_lower(o) == wanted; });
}

}  // namespace omni::http
