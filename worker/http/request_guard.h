// What `serve` refuses from a request's head alone, before it reads a byte of the body: the
// framings whose size the body limit cannot bound (chunked, compressed, none), ambiguous
// framing, bodies that are not JSON (a web page's form or text/plain post), and, on a server a
// web page could reach through DNS rebinding (no key, loopback), Host names it does not answer
// to; then a missing or wrong API key and a body over the limit, so that no byte of the body of
// a request without the key is ever read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "worker/http/api_error.h"
#include "worker/http/http_head.h"

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

// The same view of a head read off the socket.
RequestHead request_head_of(const HttpHead& head);

// The error to answer with, or nullopt to go on and read the body:
// - 400 invalid_framing: Content-Length and Transfer-Encoding together, or Content-Lengths
//   that differ or are not a number;
// - 411 length_required: a body without Content-Length (chunked), or a POST, PUT or PATCH
//   without one (its body would be read until the client closes);
// - 415 unsupported_content_encoding: a Content-Encoding other than identity;
// - 415 unsupported_media_type: a POST whose Content-Type is not application/json, save
//   multipart/form-data to a takes_form route with an Authorization header (OpenAI's SDK sends
//   video requests and image edits so; a cross-site HTML form cannot set that header);
// - 403 host_not_allowed: a Host the policy does not list.
std::optional<ApiError> refuse_request_head(const RequestHead& head, const HostPolicy& hosts);

// Who may send what: the key and the body limit, decided from the head.
struct AccessPolicy {
  std::string api_key;          // empty: no key needed
  bool metrics_public = false;  // GET /metrics without the key
  uint64_t max_body_bytes = 0;  // a larger Content-Length is refused
};

// Routes anyone may call: GET (and HEAD) /health and / (the playground), OPTIONS (CORS
// preflights), and GET /metrics when the policy makes it public.
bool is_public_route(const RequestHead& head, const AccessPolicy& access);
// Routes that take a request body (POST /v1/chat/completions, /v1/videos, /v1/videos/sync,
// /v1/images/generations, /v1/images/edits).
bool takes_body(const RequestHead& head);
// Routes that take multipart/form-data (with an Authorization header) as OpenAI's SDK sends
// them: POST /v1/videos, /v1/videos/sync, /v1/images/edits (the images to edit).
bool takes_form(const RequestHead& head);
// Whether an Authorization header carries `api_key` ("Bearer <key>"), compared in time that
// does not depend on where they differ.
bool key_matches(const std::string& authorization, const std::string& api_key);

// After refuse_request_head: the error to answer with, or nullopt:
// - 401 invalid_api_key: a route that is not public without the key (any route, unknown ones
//   too: a body is never read for a client without the key);
// - 413 request_too_large: a Content-Length over max_body_bytes, or over 4 KiB on a route that
//   takes no body.
std::optional<ApiError> refuse_request_access(const RequestHead& head, const AccessPolicy& access);

// Whether a browser page from `origin` ("https://app.example:8443") may read this server's
// answers (CORS): only the origins in `allowed_origins` ("*": any), compared without case.
// Empty `allowed_origins`: none, and the server sends no CORS headers.
bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed_origins);

}  // namespace omni::http
