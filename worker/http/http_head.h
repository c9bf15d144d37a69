// One HTTP/1.x request head as the server reads it off the socket, before cpp-httplib sees it:
// parsed, so that the connection knows the body's length and drops headers a route must not act
// on, and written back for httplib. Also the byte ranges of a Range header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace omni::http {

struct HttpHead {
  std::string method, target, version;  // "GET", "/v1/videos?limit=2", "HTTP/1.1"
  std::vector<std::pair<std::string, std::string>> headers;  // in order, values trimmed

  // The target without its query.
  std::string path() const;
  // Every value of the header `name` (any case), in order.
  std::vector<std::string> values(std::string_view name) const;
  // The first value, or "".
  std::string value(std::string_view name) const;
  bool has(std::string_view name) const;
  // Drops every header named `name` (any case).
  void erase(std::string_view name);
  // The head as it goes on the wire ("... HTTP/1.1\r\nName: value\r\n...\r\n").
  std::string serialize() const;
};

// The position just past the empty line that ends a head in `bytes` ("\r\n\r\n", or bare "\n"
// line ends), or npos when it has not ended yet.
size_t head_end(std::string_view bytes);

// Parses a head (everything through its empty line). Nullopt for anything malformed: a request
// line without three parts, a header line without a colon or with blanks before it, a line
// that folds onto the previous one (obsolete and a smuggling vector), a control character.
std::optional<HttpHead> parse_http_head(std::string_view bytes);

// How the body of a request is framed, from its head alone.
struct BodyFraming {
  enum class Kind { kNone, kLength, kChunked, kInvalid };
  Kind kind = Kind::kNone;
  uint64_t length = 0;  // kLength
};
// kInvalid: Content-Lengths that differ or are not decimal digits, or both Content-Length and
// Transfer-Encoding; kChunked: any Transfer-Encoding; kNone: neither (no body, RFC 9112 6.3).
BodyFraming body_framing(const HttpHead& head);

// One range of "bytes=0-99,200-,-50": first and last byte, either may be absent (not both).
struct ByteRange {
  std::optional<uint64_t> first, last;
};
// The ranges of a Range value, or nullopt when it is not a well-formed bytes range list or has
// more than `max_ranges` ranges (a client then gets the whole content, as RFC 9110 allows).
std::optional<std::vector<ByteRange>> parse_byte_ranges(std::string_view value, size_t max_ranges);

// What to answer a Range request for content of `size` bytes.
enum class RangeAnswer {
  kPartial,        // 206 with `spans`
  kWhole,          // 200 with everything: the spans would hold more bytes than the content
  kUnsatisfiable,  // 416: a range starts past the end
};
// Resolves `ranges` into [offset, offset + length) spans of content of `size` bytes.
RangeAnswer resolve_byte_ranges(const std::vector<ByteRange>& ranges, uint64_t size,
                                std::vector<std::pair<uint64_t, uint64_t>>* spans);

// A whole response for a connection to write itself (not through httplib): status line,
// Content-Type, Content-Length, `extra_headers` (each ending in "\r\n"), Connection: close.
std::string raw_http_response(int status, std::string_view content_type, std::string_view body,
                              std::string_view extra_headers = "");

}  // namespace omni::http
