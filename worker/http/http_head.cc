#include "worker/http/http_head.h"

#include <algorithm>
#include <cctype>

namespace omni::http {
namespace {

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token characters: what a method and a header name may hold.
bool is_token(std::string_view s) {
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kExtra.find(c) != std::string_view::npos;
  });
}

// Header values and targets: visible characters, blanks, and bytes >= 0x80 (obs-text).
bool is_field_text(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 ? u != 0x7F : u == '\t';
  });
}

std::optional<uint64_t> decimal(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;  // 19 digits fit in 63 bits
  uint64_t n = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

}  // namespace

std::string HttpHead::path() const { return target.substr(0, target.find('?')); }

std::vector<std::string> HttpHead::values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [n, v] : headers) {
    if (same_name(n, name)) out.push_back(v);
  }
  return out;
}

std::string HttpHead::value(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (same_name(n, name)) return v;
  }
  return "";
}

bool HttpHead::has(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return same_name(h.first, name); });
}

void HttpHead::erase(std::string_view name) {
  headers.erase(std::remove_if(headers.begin(), headers.end(),
                               [&](const auto& h) { return same_name(h.first, name); }),
                headers.end());
}

std::string HttpHead::serialize() const {
  std::string out = method + " " + target + " " + version + "\r\n";
  for (const auto& [n, v] : headers) out.append(n).append(": ").append(v).append("\r\n");
  return out + "\r\n";
}

size_t head_end(std::string_view bytes) {
  // A line that is empty, or holds only "\r", ends the head.
  for (size_t pos = bytes.find('\n'); pos != std::string_view::npos;
       pos = bytes.find('\n', pos + 1)) {
    const size_t next = pos + 1;
    if (next < bytes.size() && bytes[next] == '\n') return next + 1;
    if (next + 1 < bytes.size() && bytes[next] == '\r' && bytes[next + 1] == '\n') return next + 2;
  }
  return std::string_view::npos;
}

std::optional<HttpHead> parse_http_head(std::string_view bytes) {
  HttpHead head;
  bool first = true;
  while (!bytes.empty()) {
    const size_t eol = bytes.find('\n');
    if (eol == std::string_view::npos) return std::nullopt;  // no empty line at the end
    std::string_view line = bytes.substr(0, eol);
    bytes.remove_prefix(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (first) return std::nullopt;
      return bytes.empty() ? std::optional<HttpHead>(std::move(head)) : std::nullopt;
    }
    if (first) {
      first = false;
      const size_t a = line.find(' ');
      const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
      if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos) {
        return std::nullopt;
      }
      head.method = std::string(line.substr(0, a));
      head.target = std::string(line.substr(a + 1, b - a - 1));
      head.version = std::string(line.substr(b + 1));
      if (!is_token(head.method) || head.target.empty() || !is_field_text(head.target) ||
          (head.version != "HTTP/1.1" && head.version != "HTTP/1.0")) {
        return std::nullopt;
      }
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    if (!is_token(name) || !is_field_text(value)) return std::nullopt;
    head.headers.emplace_back(std::string(name), std::string(value));
  }
  return std::nullopt;
}

BodyFraming body_framing(const HttpHead& head) {
  BodyFraming f;
  const auto lengths = head.values("Content-Length");
  const bool transfer = head.has("Transfer-Encoding");
  if (transfer) {
    f.kind = lengths.empty() ? BodyFraming::Kind::kChunked : BodyFraming::Kind::kInvalid;
    return f;
  }
  if (lengths.empty()) return f;
  for (const auto& v : lengths) {
    const auto n = decimal(v);
    if (!n || (f.kind == BodyFraming::Kind::kLength && *n != f.length)) {
      f.kind = BodyFraming::Kind::kInvalid;
      return f;
    }
    f.kind = BodyFraming::Kind::kLength;
    f.length = *n;
  }
  return f;
}

std::optional<std::vector<ByteRange>> parse_byte_ranges(std::string_view value, size_t max_ranges) {
  value = trim(value);
  constexpr std::string_view kUnit = "bytes=";
  if (value.size() < kUnit.size() || !same_name(value.substr(0, kUnit.size()), kUnit)) {
    return std::nullopt;
  }
  value.remove_prefix(kUnit.size());
  std::vector<ByteRange> ranges;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view item = trim(value.substr(0, comma));
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos || ranges.size() == max_ranges) return std::nullopt;
    ByteRange r;
    const std::string_view first = item.substr(0, dash), last = item.substr(dash + 1);
    if (!first.empty() && !(r.first = decimal(first))) return std::nullopt;
    if (!last.empty() && !(r.last = decimal(last))) return std::nullopt;
    if ((!r.first && !r.last) || (r.first && r.last && *r.first > *r.last)) return std::nullopt;
    ranges.push_back(r);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return ranges;
}

RangeAnswer resolve_byte_ranges(const std::vector<ByteRange>& ranges, uint64_t size,
                                std::vector<std::pair<uint64_t, uint64_t>>* spans) {
  spans->clear();
  uint64_t total = 0;
  for (const ByteRange& r : ranges) {
    uint64_t first = 0, last = 0;
    if (!r.first) {  // the last *r.last bytes
      if (*r.last == 0 || size == 0) continue;
      first = size - std::min(*r.last, size);
      last = size - 1;
    } else {
      if (*r.first >= size) continue;  // unsatisfiable: skipped (RFC 9110 14.1.2)
      first = *r.first;
      last = std::min(r.last.value_or(size - 1), size - 1);
    }
    spans->emplace_back(first, last - first + 1);
    total += last - first + 1;
  }
  if (spans->empty()) return RangeAnswer::kUnsatisfiable;
  if (total > size) {
    spans->clear();
    return RangeAnswer::kWhole;
  }
  return RangeAnswer::kPartial;
}

std::string raw_http_response(int status, std::string_view content_type, std::string_view body,
                              std::string_view extra_headers) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized"
                       : status == 431 ? "Request Header Fields Too Large"
                       : status == 500 ? "Internal Server Error"
                       : status == 503 ? "Service Unavailable"
                                       : "Error";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  if (!body.empty()) out.append("Content-Type: ").append(content_type).append("\r\n");
  out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  out.append(extra_headers).append("Connection: close\r\n\r\n").append(body);
  return out;
}

}  // namespace omni::http
