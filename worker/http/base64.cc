#include "worker/http/base64.h"

#include <array>
#include <cctype>
#include <cstdint>

#include "worker/http/api_error.h"

namespace omni::http {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr uint8_t kInvalid = 0xFF;

// Character -> 6-bit value, kInvalid for everything outside the alphabet ('=' included).
constexpr std::array<uint8_t, 256> make_decode_table() {
  std::array<uint8_t, 256> table{};
  for (auto& v : table) v = kInvalid;
  for (uint8_t i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = i;
  return table;
}
constexpr std::array<uint8_t, 256> kDecode = make_decode_table();

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && lower(s.substr(0, prefix.size())) == prefix;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    const int hi = hex_value(text[i + 1]), lo = hex_value(text[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (rest == 2) v |= uint32_t{p[i + 1]} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  const size_t body = text.size() - padding;  // characters that carry bits
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < body; ++i) {
    const uint8_t v = kDecode[static_cast<uint8_t>(text[i])];
    if (v == kInvalid) return std::nullopt;  // outside the alphabet, or '=' before the end
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  // What is left are the unused low bits of the last character: 2 (one '=') or 4 (two).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

DataUrl parse_data_url(const std::string& url, const std::string& param) {
  if (!starts_with_ci(url, "data:")) {
    throw ApiException(
        bad_request(param + ": fetching URLs is not supported: send the bytes as a data: URL "
                            "(data:<media type>;base64,<data>)",
                    param, "remote_url"));
  }
  const size_t comma = url.find(',');
  if (comma == std::string::npos) {
    throw ApiException(bad_request(param + ": malformed data: URL (no ',' before the data)", param,
                                   "invalid_value"));
  }
  // The header: media type, then ';'-separated parameters, the last of which may be "base64".
  const std::string_view header = std::string_view(url).substr(5, comma - 5);
  const std::string_view payload = std::string_view(url).substr(comma + 1);
  DataUrl out;
  bool is_base64 = false;
  size_t start = 0;
  for (size_t index = 0; start <= header.size(); ++index) {
    size_t end = header.find(';', start);
    if (end == std::string_view::npos) end = header.size();
    const std::string item = lower(trim(header.substr(start, end - start)));
    if (index == 0) {
      out.media_type = item;
    } else if (item == "base64") {
      if (end != header.size()) {
        throw ApiException(
            bad_request(param + ": malformed data: URL (';base64' must come last, before the ',')",
                        param, "invalid_value"));
      }
      is_base64 = true;
    }
    // Other parameters (charset=..., name=...) say nothing about the bytes: ignored.
    start = end + 1;
  }
  if (is_base64) {
    auto bytes = base64_decode(payload);
    if (!bytes) {
      throw ApiException(bad_request(
          param + ": the data: URL's payload is not valid base64 (standard alphabet, padded, " +
              "no whitespace)",
          param, "invalid_base64"));
    }
    out.data = std::move(*bytes);
  } else {
    auto bytes = percent_decode(payload);
    if (!bytes) {
      throw ApiException(
          bad_request(param + ": malformed data: URL (a '%' not followed by two hex digits)", param,
                      "invalid_value"));
    }
    out.data = std::move(*bytes);
  }
  return out;
}

}  // namespace omni::http
