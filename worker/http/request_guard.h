// What `serve` refuses from a request's head alone, before it reads a byte of the body: the
// framings whose size the body limit cannot bound (chunked, compressed), ambiguous framing,
// bodies that are not JSON (a web page's form or text/plain post), and, on a server a web page
// could reach through DNS rebinding (no key, loopback), Host names it does not answer to.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "worker/http/api_error.h"

namespace omni::http {

struct HostPolicy {
  // Host names (no port) the server answers to; empty: any. Lowercase.
  std::vector<std::string> allowed;
};

// The Host names a server listening on `listen_host` answers to. With `allowed_hosts` ("*":
// any), those plus the loopback names; without, a keyless server on a loopback address answers
// to the loopback names only, and any other server to any name (it is reachable by address, and
// a key or the network guards it).
HostPolicy host_policy(const std::string& listen_host, bool has_api_key,
                       const std::vector<std::string>& allowed_hosts);

// One request's head: its method and every value of a header (case-insensitive name).
struct RequestHead {
  std::string method;
  std::function<std::vector<std::string>(const std::string& name)> header_values;
  // The target's path ("/v1/videos"); empty: not known.
  std::string path = "";
};

// The error to answer with, or nullopt to go on and read the body:
// - 400 invalid_framing: Content-Length and Transfer-Encoding together, or Content-Lengths
//   that differ;
// - 411 length_required: a body without Content-Length (chunked);
// - 415 unsupported_content_encoding: a Content-Encoding other than identity;
// - 415 unsupported_media_type: a POST whose Content-Type is not application/json, save
//   multipart/form-data to POST /v1/videos[/sync] with an Authorization header (OpenAI's SDK
//   sends video requests so; a cross-site HTML form cannot set that header);
// - 403 host_not_allowed: a Host the policy does not list.
std::optional<ApiError> refuse_request_head(const RequestHead& head, const HostPolicy& hosts);

// Whether a browser page from `origin` ("https://app.example:8443") may read this server's
// answers (CORS): only the origins in `allowed_origins` ("*": any), compared without case.
// Empty `allowed_origins`: none, and the server sends no CORS headers.
bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed_origins);

}  // namespace omni::http
