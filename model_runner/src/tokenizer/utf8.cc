#include "utf8.h"

namespace omni::models::utf8 {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Bytes of the character at text[pos] that fit a well-formed sequence; `*complete` says whether
// they make up the whole character. An incomplete run is the maximal ill-formed subpart that one
// U+FFFD replaces (at least one byte, so that scanning always advances).
size_t scan(std::string_view text, size_t pos, bool* complete) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char lead = at(0);
  *complete = true;
  if (lead < 0x80) return 1;
  size_t need;
  unsigned char second_lo = 0x80, second_hi = 0xBF;  // the lead byte narrows the second's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) second_lo = 0xA0;  // overlong
    if (lead == 0xED) second_hi = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) second_lo = 0x90;  // overlong
    if (lead == 0xF4) second_hi = 0x8F;  // above U+10FFFF
  } else {
    *complete = false;
    return 1;
  }
  size_t have = 1;
  if (pos + 1 < text.size() && at(1) >= second_lo && at(1) <= second_hi) {
    have = 2;
    while (have < need && pos + have < text.size() && is_continuation(at(have))) ++have;
  }
  *complete = have == need;
  return have;
}

}  // namespace

size_t char_length(std::string_view text, size_t pos) {
  bool complete;
  const size_t n = scan(text, pos, &complete);
  return complete ? n : 0;
}

size_t count_chars(std::string_view text) {
  size_t n = 0;
  for (const char c : text) n += is_continuation(static_cast<unsigned char>(c)) ? 0 : 1;
  return n;
}

size_t find_invalid(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = char_length(text, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

void decode(std::string_view text, std::vector<char32_t>* out) {
  for (size_t pos = 0; pos < text.size();) {
    const auto b = static_cast<unsigned char>(text[pos]);
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t i = 1; i < n; ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
    out->push_back(cp);
    pos += n;
  }
}

void append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    bool complete;
    const size_t n = scan(bytes, pos, &complete);
    if (complete) {
      out.append(bytes.data() + pos, n);
    } else {
      append(kReplacement, &out);
    }
    pos += n;
  }
  return out;
}

size_t stable_prefix(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete;
    const size_t n = scan(bytes, pos, &complete);
    // An incomplete run that reaches the end after a valid lead byte may still become a
    // character; any other incomplete run is ill-formed whatever follows.
    const auto lead = static_cast<unsigned char>(bytes[pos]);
    if (!complete && pos + n == bytes.size() && lead >= 0xC2 && lead <= 0xF4) break;
    pos += n;
  }
  return pos;
}

}  // namespace omni::models::utf8
