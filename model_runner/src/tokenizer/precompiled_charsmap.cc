#include "precompiled_charsmap.h"

#include <algorithm>
#include <array>

#include "unicode_nfc_tables.h"
#include "utf8.h"

namespace omni::models {
namespace {

bool base64_decode(const std::string& in, std::string* out) {
  std::array<int, 256> value{};
  value.fill(-1);
  const std::string_view alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < alphabet.size(); ++i) {
    value[static_cast<unsigned char>(alphabet[i])] = static_cast<int>(i);
  }
  uint32_t bits = 0;
  int nbits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = value[static_cast<unsigned char>(in[i])];
    if (v < 0) return false;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out->push_back(static_cast<char>((bits >> nbits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i) {
    if (in[i] != '=') return false;
  }
  return true;
}

uint32_t ccc(char32_t cp) {
  const auto* begin = unicode_tables::kCombiningClasses;
  const auto* end = begin + unicode_tables::kNumCombiningClasses;
  const auto* it = std::upper_bound(
      begin, end, static_cast<uint32_t>(cp),
      [](uint32_t c, const unicode_tables::CombiningClassRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return static_cast<uint32_t>(cp) <= it->last ? it->ccc : 0;
}

// Characters that never start a grapheme cluster (see the header for what is left out).
bool is_extend(char32_t cp) {
  return ccc(cp) != 0 || (cp >= 0xFE00 && cp <= 0xFE0F) || cp == 0x200C || cp == 0x200D ||
         (cp >= 0x1F3FB && cp <= 0x1F3FF) || (cp >= 0xE0020 && cp <= 0xE007F) ||
         (cp >= 0xE0100 && cp <= 0xE01EF);
}

// Grapheme_Cluster_Break=Control (the common part: C0 / C1 controls, line and paragraph
// separators, format characters other than ZWNJ / ZWJ): clusters break before and after them.
bool is_control(char32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xAD || cp == 0x61C || cp == 0x180E ||
         cp == 0x200B || cp == 0x200E || cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF || (cp >= 0xFFF0 && cp <= 0xFFFB) ||
         (cp >= 0xE0000 && cp <= 0xE001F) || (cp >= 0xE01F0 && cp <= 0xE0FFF);
}

bool is_pictographic(char32_t cp) {
  return (cp >= 0x2600 && cp <= 0x27BF) || (cp >= 0x1F000 && cp <= 0x1FAFF);
}

char32_t code_point_at(std::string_view text, size_t pos, size_t len) {
  std::vector<char32_t> cps;
  utf8::decode(text.substr(pos, len), &cps);
  return cps.empty() ? 0 : cps[0];
}

}  // namespace

PrecompiledCharsmap::PrecompiledCharsmap(const JsonField& field) {
  const JsonField map = field.get("precompiled_charsmap");
  std::string blob;
  if (!base64_decode(map.string(), &blob)) map.fail("is not base64");
  if (blob.size() < 4) map.fail("is shorter than its 4-byte header");
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) {
    trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(blob[static_cast<size_t>(i)]);
  }
  if (trie_bytes % 4 != 0 || trie_bytes == 0 || 4 + static_cast<size_t>(trie_bytes) > blob.size()) {
    map.fail("has a trie size (" + std::to_string(trie_bytes) + " bytes) that does not fit");
  }
  trie_.resize(trie_bytes / 4);
  for (size_t u = 0; u < trie_.size(); ++u) {
    uint32_t unit = 0;
    for (int i = 3; i >= 0; --i) {
      unit = (unit << 8) | static_cast<unsigned char>(blob[4 + 4 * u + static_cast<size_t>(i)]);
    }
    trie_[u] = unit;
  }
  normalized_ = blob.substr(4 + trie_bytes);
  normalized_.push_back('\0');  // every replacement ends, even a malformed last one
}

const char* PrecompiledCharsmap::transform(std::string_view key) const {
  const auto offset = [](uint32_t unit) -> size_t {
    return static_cast<size_t>(unit >> 10) << ((unit & (1u << 9)) >> 6);
  };
  size_t pos = offset(trie_[0]);
  for (const char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) break;
    pos ^= c;
    if (pos >= trie_.size()) return nullptr;
    const uint32_t unit = trie_[pos];
    if ((unit & ((1u << 31) | 0xFFu)) != c) return nullptr;
    pos ^= offset(unit);
    if (pos >= trie_.size()) return nullptr;
    if ((unit >> 8) & 1u) {
      const size_t index = trie_[pos] & ((1u << 31) - 1);
      return index < normalized_.size() ? normalized_.c_str() + index : nullptr;
    }
  }
  return nullptr;
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    // The grapheme cluster starting at pos.
    size_t end = pos + utf8::char_length(text, pos);
    char32_t prev = code_point_at(text, pos, end - pos);
    while (end < text.size()) {
      const size_t len = utf8::char_length(text, end);
      const char32_t cp = code_point_at(text, end, len);
      const bool joins = (prev == U'\r' && cp == U'\n') ||
                         (!is_control(prev) && !is_control(cp) &&
                          (is_extend(cp) || (prev == 0x200D && is_pictographic(cp))));
      if (!joins) break;
      prev = cp;
      end += len;
    }
    const std::string_view grapheme = text.substr(pos, end - pos);
    const char* whole = grapheme.size() < 6 ? transform(grapheme) : nullptr;
    if (whole != nullptr) {
      out += whole;
    } else {
      for (size_t c = 0; c < grapheme.size();) {
        const size_t len = utf8::char_length(grapheme, c);
        const std::string_view ch = grapheme.substr(c, len);
        const char* norm = transform(ch);
        if (norm != nullptr) {
          out += norm;
        } else {
          out += ch;
        }
        c += len;
      }
    }
    pos = end;
  }
  return out;
}

}  // namespace omni::models
