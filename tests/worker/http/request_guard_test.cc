// What `serve` refuses from a request's head (worker/http/request_guard.h): each refusal with its
// status and code, the requests it lets through, and the Host policy for each kind of listener.
#include "worker/http/request_guard.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace omni::http {
namespace {

// A head with headers given as name/value pairs (names as a client might case them).
RequestHead head(std::string method, std::vector<std::pair<std::string, std::string>> headers) {
  RequestHead h;
  h.method = std::move(method);
  h.header_values = [headers = std::move(headers)](const std::string& name) {
    std::vector<std::string> values;
    auto lower = [](std::string s) {
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    };
    for (const auto& [n, v] : headers) {
      if (lower(n) == lower(name)) values.push_back(v);
    }
    return values;
  };
  return h;
}

const HostPolicy kAnyHost;

int status_of(const RequestHead& h, const HostPolicy& hosts = kAnyHost) {
  const auto e = refuse_request_head(h, hosts);
  return e ? e->status : 0;
}

std::string code_of(const RequestHead& h, const HostPolicy& hosts = kAnyHost) {
  const auto e = refuse_request_head(h, hosts);
  return e ? e->code : "";
}

TEST(RequestGuard, AJsonPostWithALengthGoesThrough) {
  EXPECT_EQ(status_of(head("POST", {{"Content-Type", "application/json"},
                                    {"Content-Length", "12"},
                                    {"Host", "127.0.0.1:8091"}})),
            0);
  EXPECT_EQ(status_of(head("POST", {{"content-type", "Application/JSON; charset=utf-8"},
                                    {"Content-Length", "12"}})),
            0);
  EXPECT_EQ(status_of(head("GET", {{"Host", "localhost"}})), 0);
  EXPECT_EQ(status_of(head("POST", {{"Content-Type", "application/json"},
                                    {"Content-Encoding", "identity"},
                                    {"Content-Length", "2"}})),
            0);
}

TEST(RequestGuard, ChunkedBodiesNeedALength) {
  const auto h =
      head("POST", {{"Content-Type", "application/json"}, {"Transfer-Encoding", "chunked"}});
  EXPECT_EQ(status_of(h), 411);
  EXPECT_EQ(code_of(h), "length_required");
}

TEST(RequestGuard, AmbiguousFramingIsRefused) {
  EXPECT_EQ(code_of(head("POST", {{"Content-Type", "application/json"},
                                  {"Content-Length", "10"},
                                  {"Transfer-Encoding", "chunked"}})),
            "invalid_framing");
  EXPECT_EQ(status_of(head("POST", {{"Content-Type", "application/json"},
                                    {"Content-Length", "10"},
                                    {"Content-Length", "11"}})),
            400);
  // The same length twice is one length.
  EXPECT_EQ(status_of(head("POST", {{"Content-Type", "application/json"},
                                    {"Content-Length", "10"},
                                    {"Content-Length", "10"}})),
            0);
}

TEST(RequestGuard, CompressedBodiesAreRefusedBeforeTheyAreInflated) {
  for (const char* encoding : {"gzip", "deflate", "br", "GZIP", "gzip, identity"}) {
    SCOPED_TRACE(encoding);
    const auto h = head("POST", {{"Content-Type", "application/json"},
                                 {"Content-Encoding", encoding},
                                 {"Content-Length", "100"}});
    EXPECT_EQ(status_of(h), 415);
    EXPECT_EQ(code_of(h), "unsupported_content_encoding");
  }
}

TEST(RequestGuard, PostsThatAreNotJsonAreRefused) {
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded",
                           "multipart/form-data; boundary=x", "", "application/jsonx"}) {
    SCOPED_TRACE(type);
    std::vector<std::pair<std::string, std::string>> headers = {{"Content-Length", "2"}};
    if (*type) headers.emplace_back("Content-Type", type);
    const auto h = head("POST", headers);
    EXPECT_EQ(status_of(h), 415);
    EXPECT_EQ(code_of(h), "unsupported_media_type");
  }
}

TEST(RequestGuard, AKeylessLoopbackServerAnswersLoopbackNamesOnly) {
  const auto hosts = host_policy("127.0.0.1", /*has_api_key=*/false, {});
  for (const char* host :
       {"127.0.0.1:8091", "localhost:8091", "LOCALHOST", "[::1]:8091", "localhost."}) {
    SCOPED_TRACE(host);
    EXPECT_EQ(status_of(head("GET", {{"Host", host}}), hosts), 0);
  }
  // A page on attacker.example whose name now resolves to 127.0.0.1 (DNS rebinding).
  const auto rebound = head("GET", {{"Host", "attacker.example:8091"}});
  EXPECT_EQ(status_of(rebound, hosts), 403);
  EXPECT_EQ(code_of(rebound, hosts), "host_not_allowed");
  EXPECT_EQ(status_of(head("GET", {{"Host", "127.0.0.2"}}), hosts), 403);
  // --allowed-hosts adds names; "*" turns the check off.
  const auto more = host_policy("127.0.0.1", false, {"My-Box.lan"});
  EXPECT_EQ(status_of(head("GET", {{"Host", "my-box.lan:8091"}}), more), 0);
  EXPECT_EQ(status_of(rebound, more), 403);
  EXPECT_EQ(status_of(rebound, host_policy("127.0.0.1", false, {"*"})), 0);
}

TEST(RequestGuard, KeyedOrNetworkServersAnswerAnyNameUnlessToldOtherwise) {
  const auto rebound = head("GET", {{"Host", "attacker.example"}});
  EXPECT_EQ(status_of(rebound, host_policy("127.0.0.1", /*has_api_key=*/true, {})), 0);
  EXPECT_EQ(status_of(rebound, host_policy("0.0.0.0", false, {})), 0);
  // Given names are enforced on any listener, the listen address and loopback names included.
  const auto listed = host_policy("10.0.0.5", true, {"api.example"});
  EXPECT_EQ(status_of(rebound, listed), 403);
  EXPECT_EQ(status_of(head("GET", {{"Host", "api.example"}}), listed), 0);
  EXPECT_EQ(status_of(head("GET", {{"Host", "10.0.0.5:8091"}}), listed), 0);
  EXPECT_EQ(status_of(head("GET", {{"Host", "[::1]:1"}}), host_policy("::1", false, {})), 0);
}

// OpenAI's SDK posts video requests as forms; a cross-site HTML form cannot add Authorization.
TEST(RequestGuard, VideoFormsPassOnlyWithAnAuthorizationHeader) {
  const std::vector<std::pair<std::string, std::string>> form = {
      {"Content-Type", "multipart/form-data; boundary=x"}, {"Content-Length", "2"}};
  auto with_key = form;
  with_key.emplace_back("Authorization", "Bearer k");
  for (const char* path : {"/v1/videos", "/v1/videos/sync"}) {
    SCOPED_TRACE(path);
    auto h = head("POST", with_key);
    h.path = path;
    EXPECT_EQ(status_of(h), 0);
    h = head("POST", form);
    h.path = path;
    EXPECT_EQ(status_of(h), 415);
    EXPECT_EQ(code_of(h), "unsupported_media_type");
  }
  for (const char* path : {"/v1/chat/completions", "/v1/videos/x", ""}) {
    SCOPED_TRACE(path);
    auto h = head("POST", with_key);
    h.path = path;
    EXPECT_EQ(status_of(h), 415);
  }
  auto h = head("POST", {{"Content-Type", "application/x-www-form-urlencoded"},
                         {"Content-Length", "2"},
                         {"Authorization", "Bearer k"}});
  h.path = "/v1/videos";
  EXPECT_EQ(status_of(h), 415);
}

// A body without a length would be read until the client closes: refused from the head.
TEST(RequestGuard, BodiesWithoutALengthAreRefused) {
  for (const char* method : {"POST", "PUT", "PATCH"}) {
    SCOPED_TRACE(method);
    const auto h = head(method, {{"Content-Type", "application/json"}});
    EXPECT_EQ(status_of(h), 411);
    EXPECT_EQ(code_of(h), "length_required");
  }
  // Without a length these have no body (RFC 9112 6.3).
  EXPECT_EQ(status_of(head("GET", {})), 0);
  EXPECT_EQ(status_of(head("DELETE", {})), 0);
  EXPECT_EQ(code_of(head("POST", {{"Content-Type", "application/json"}, {"Content-Length", "x"}})),
            "invalid_framing");
}

RequestHead at(std::string method, std::string path,
               std::vector<std::pair<std::string, std::string>> headers) {
  RequestHead h = head(std::move(method), std::move(headers));
  h.path = std::move(path);
  return h;
}

int access_status(const RequestHead& h, const AccessPolicy& access) {
  const auto e = refuse_request_access(h, access);
  return e ? e->status : 0;
}

TEST(RequestGuard, TheKeyIsDecidedFromTheHeadOnEveryRouteButThePublicOnes) {
  AccessPolicy access;
  access.api_key = "k";
  access.max_body_bytes = 1000;
  const std::pair<std::string, std::string> key = {"Authorization", "Bearer k"};
  for (const char* path : {"/v1/chat/completions", "/v1/videos", "/v1/models", "/nowhere"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(access_status(at("POST", path, {{"Content-Length", "10"}}), access), 401);
    EXPECT_EQ(
        access_status(at("POST", path, {{"Content-Length", "10"}, {"Authorization", "k"}}), access),
        401);
    EXPECT_EQ(
        access_status(at("POST", path, {{"Content-Length", "10"}, {"Authorization", "Bearer j"}}),
                      access),
        401);
  }
  EXPECT_EQ(
      access_status(at("POST", "/v1/chat/completions", {{"Content-Length", "10"}, key}), access),
      0);
  EXPECT_EQ(refuse_request_access(at("GET", "/v1/models", {}), access)->code, "invalid_api_key");
  // Two Authorization headers: not a key.
  EXPECT_EQ(access_status(at("GET", "/v1/models", {key, key}), access), 401);
  for (const char* path : {"/health", "/"}) {
    EXPECT_EQ(access_status(at("GET", path, {}), access), 0);
  }
  EXPECT_EQ(access_status(at("OPTIONS", "/v1/chat/completions", {}), access), 0);
  EXPECT_EQ(access_status(at("GET", "/metrics", {}), access), 401);
  access.metrics_public = true;
  EXPECT_EQ(access_status(at("GET", "/metrics", {}), access), 0);
  EXPECT_EQ(access_status(at("POST", "/metrics", {{"Content-Length", "0"}}), access), 401);
  // No key set: every route is open.
  EXPECT_EQ(access_status(at("GET", "/v1/models", {}), AccessPolicy{"", false, 1000}), 0);
}

TEST(RequestGuard, BodiesOverTheLimitOrOnRoutesWithoutOneAreRefusedFromTheHead) {
  AccessPolicy access;
  access.max_body_bytes = 1000;
  EXPECT_EQ(access_status(at("POST", "/v1/chat/completions", {{"Content-Length", "1000"}}), access),
            0);
  const auto big = at("POST", "/v1/chat/completions", {{"Content-Length", "1001"}});
  EXPECT_EQ(access_status(big, access), 413);
  EXPECT_EQ(refuse_request_access(big, access)->code, "request_too_large");
  EXPECT_EQ(access_status(at("POST", "/v1/videos/sync", {{"Content-Length", "900"}}), access), 0);
  // Routes that take no body take no more than a small one, whatever the body limit.
  access.max_body_bytes = 1 << 20;
  EXPECT_EQ(access_status(at("DELETE", "/v1/videos/x", {{"Content-Length", "4096"}}), access), 0);
  EXPECT_EQ(access_status(at("DELETE", "/v1/videos/x", {{"Content-Length", "4097"}}), access), 413);
  EXPECT_EQ(access_status(at("GET", "/", {{"Content-Length", "5000"}}), access), 413);
}

TEST(RequestGuard, ImageEditsAreFormsWithTheKey) {
  AccessPolicy access;
  access.api_key = "k";
  access.max_body_bytes = 1000;
  // OpenAI's SDK sends an edit as a form with its images: admitted with an Authorization header
  // (a cross-site HTML form cannot set one), under the body limit like any body.
  const std::vector<std::pair<std::string, std::string>> form = {
      {"Content-Type", "multipart/form-data; boundary=x"}, {"Content-Length", "500"}};
  auto edit = at("POST", "/v1/images/edits", form);
  EXPECT_TRUE(takes_form(edit));
  EXPECT_TRUE(takes_body(edit));
  EXPECT_EQ(status_of(edit), 415);  // no Authorization header
  EXPECT_EQ(access_status(edit, access), 401);
  auto with_key = form;
  with_key.emplace_back("Authorization", "Bearer k");
  EXPECT_EQ(status_of(at("POST", "/v1/images/edits", with_key)), 0);
  EXPECT_EQ(access_status(at("POST", "/v1/images/edits", with_key), access), 0);
  auto large = with_key;
  large[1].second = "5000000";
  EXPECT_EQ(access_status(at("POST", "/v1/images/edits", large), access), 413);
  // Generations are JSON with a body under the limit, as chat requests; no forms.
  const auto generation = at("POST", "/v1/images/generations", with_key);
  EXPECT_FALSE(takes_form(generation));
  EXPECT_TRUE(takes_body(generation));
  EXPECT_EQ(status_of(generation), 415);
  EXPECT_EQ(access_status(at("POST", "/v1/images/generations",
                             {{"Content-Length", "1000"}, {"Authorization", "Bearer k"}}),
                          access),
            0);
}

TEST(RequestGuard, KeysCompareWhole) {
  EXPECT_TRUE(key_matches("Bearer secret", "secret"));
  EXPECT_FALSE(key_matches("Bearer secre", "secret"));
  EXPECT_FALSE(key_matches("Bearer secrets", "secret"));
  EXPECT_FALSE(key_matches("bearer secret", "secret"));
  EXPECT_FALSE(key_matches("", "secret"));
}

TEST(RequestGuard, AParsedHeadReadsLikeAnyOther) {
  const auto parsed = parse_http_head(
      "POST /v1/chat/completions?x=1 HTTP/1.1\r\nContent-Type: text/plain\r\n"
      "Content-Length: 2\r\n\r\n");
  ASSERT_TRUE(parsed);
  const RequestHead h = request_head_of(*parsed);
  EXPECT_EQ(h.path, "/v1/chat/completions");
  EXPECT_EQ(status_of(h), 415);
}

}  // namespace
}  // namespace omni::http
