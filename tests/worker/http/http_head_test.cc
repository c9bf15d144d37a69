// Request heads as the server's connection reads them (worker/http/http_head.h): parsing and what
// it refuses, the body's framing from the head, and byte ranges parsed and resolved.
#include "worker/http/http_head.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace omni::http {
namespace {

using Spans = std::vector<std::pair<uint64_t, uint64_t>>;

TEST(HttpHead, ParsesTheRequestLineAndHeadersAndWritesThemBack) {
  const std::string text =
      "POST /v1/videos?limit=2 HTTP/1.1\r\nHost: x\r\ncontent-length:  12 \r\nX-A: 1\r\n\r\n";
  ASSERT_EQ(head_end(text), text.size());
  const auto head = parse_http_head(text);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->method, "POST");
  EXPECT_EQ(head->target, "/v1/videos?limit=2");
  EXPECT_EQ(head->path(), "/v1/videos");
  EXPECT_EQ(head->value("Content-Length"), "12");  // any case, blanks trimmed
  EXPECT_TRUE(head->has("x-a"));
  EXPECT_EQ(head->serialize(),
            "POST /v1/videos?limit=2 HTTP/1.1\r\nHost: x\r\ncontent-length: 12\r\nX-A: 1\r\n\r\n");
  // Bare line feeds end a head too.
  EXPECT_EQ(head_end("GET / HTTP/1.1\nHost: x\n\nbody"), 24u);
  EXPECT_EQ(head_end("GET / HTTP/1.1\r\nHost: x\r\n"), std::string::npos);
}

TEST(HttpHead, RefusesMalformedHeads) {
  for (const char* text : {
           "GET /\r\n\r\n",                              // no version
           "GET  / HTTP/1.1\r\n\r\n",                    // two blanks
           "GET / HTTP/2\r\n\r\n",                       // not 1.x
           "G(T / HTTP/1.1\r\n\r\n",                     // not a token
           "GET / HTTP/1.1\r\nNo colon\r\n\r\n",         // a header without a colon
           "GET / HTTP/1.1\r\nBad : x\r\n\r\n",          // a blank before the colon
           "GET / HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n",  // obsolete line folding
           "GET / HTTP/1.1\r\nA: \x01\r\n\r\n",          // a control character
           "GET / HTTP/1.1\r\n\r\nextra",                // bytes after the head
       }) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(parse_http_head(text));
  }
}

TEST(HttpHead, FramingComesFromTheHeadAlone) {
  const auto framing = [](const std::string& headers) {
    return body_framing(*parse_http_head("POST / HTTP/1.1\r\n" + headers + "\r\n"));
  };
  EXPECT_EQ(framing("").kind, BodyFraming::Kind::kNone);
  EXPECT_EQ(framing("Content-Length: 7\r\n").length, 7u);
  EXPECT_EQ(framing("Content-Length: 7\r\ncontent-length: 7\r\n").kind, BodyFraming::Kind::kLength);
  EXPECT_EQ(framing("Content-Length: 7\r\nContent-Length: 8\r\n").kind,
            BodyFraming::Kind::kInvalid);
  EXPECT_EQ(framing("Content-Length: -1\r\n").kind, BodyFraming::Kind::kInvalid);
  EXPECT_EQ(framing("Content-Length: 99999999999999999999\r\n").kind, BodyFraming::Kind::kInvalid);
  EXPECT_EQ(framing("Transfer-Encoding: chunked\r\n").kind, BodyFraming::Kind::kChunked);
  EXPECT_EQ(framing("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n").kind,
            BodyFraming::Kind::kInvalid);
}

TEST(ByteRanges, ParseAFewWellFormedRangesOnly) {
  const auto r = parse_byte_ranges("bytes=0-9, 20-,-5", 8);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].first, 0u);
  EXPECT_EQ((*r)[0].last, 9u);
  EXPECT_EQ((*r)[1].first, 20u);
  EXPECT_FALSE((*r)[1].last);
  EXPECT_FALSE((*r)[2].first);
  EXPECT_EQ((*r)[2].last, 5u);
  EXPECT_TRUE(parse_byte_ranges("Bytes=1-1", 1));
  for (const char* bad :
       {"bytes=", "bytes=-", "bytes=5-1", "items=0-1", "bytes=a-1", "0-1", "bytes=0-1,,2-3"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parse_byte_ranges(bad, 8));
  }
  std::string many = "bytes=0-0";
  for (int i = 1; i < 9; ++i) many += "," + std::to_string(i) + "-" + std::to_string(i);
  EXPECT_TRUE(parse_byte_ranges(many, 9));
  EXPECT_FALSE(parse_byte_ranges(many, 8));  // more than max_ranges: the whole content instead
}

TEST(ByteRanges, ResolveAgainstTheContent) {
  const auto resolve = [](const std::string& value, uint64_t size, Spans* spans) {
    return resolve_byte_ranges(*parse_byte_ranges(value, 8), size, spans);
  };
  Spans spans;
  EXPECT_EQ(resolve("bytes=0-9", 100, &spans), RangeAnswer::kPartial);
  EXPECT_EQ(spans, (Spans{{0, 10}}));
  EXPECT_EQ(resolve("bytes=90-", 100, &spans), RangeAnswer::kPartial);
  EXPECT_EQ(spans, (Spans{{90, 10}}));
  EXPECT_EQ(resolve("bytes=-30", 100, &spans), RangeAnswer::kPartial);
  EXPECT_EQ(spans, (Spans{{70, 30}}));
  EXPECT_EQ(resolve("bytes=95-200", 100, &spans), RangeAnswer::kPartial);  // clipped to the end
  EXPECT_EQ(spans, (Spans{{95, 5}}));
  EXPECT_EQ(resolve("bytes=-500", 100, &spans), RangeAnswer::kPartial);
  EXPECT_EQ(spans, (Spans{{0, 100}}));
  // Unsatisfiable ranges are skipped; none left: 416.
  EXPECT_EQ(resolve("bytes=100-,0-0", 100, &spans), RangeAnswer::kPartial);
  EXPECT_EQ(spans, (Spans{{0, 1}}));
  EXPECT_EQ(resolve("bytes=100-", 100, &spans), RangeAnswer::kUnsatisfiable);
  EXPECT_EQ(resolve("bytes=-0", 100, &spans), RangeAnswer::kUnsatisfiable);
  EXPECT_EQ(resolve("bytes=0-", 0, &spans), RangeAnswer::kUnsatisfiable);
  // Spans holding more bytes than the content (overlapping copies): the whole content.
  EXPECT_EQ(resolve("bytes=0-,0-", 100, &spans), RangeAnswer::kWhole);
  EXPECT_TRUE(spans.empty());
  EXPECT_EQ(resolve("bytes=0-49,50-99", 100, &spans), RangeAnswer::kPartial);
}

TEST(RawHttpResponse, StatesLengthAndClose) {
  EXPECT_EQ(raw_http_response(503, "application/json", "{}", "Retry-After: 1\r\n"),
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}");
}

}  // namespace
}  // namespace omni::http
