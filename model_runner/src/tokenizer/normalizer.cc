#include "normalizer.h"

#include "oniguruma_pattern.h"
#include "pcre2_regex.h"
#include "unicode_nfc.h"
#include "utf8.h"

namespace omni::models {
namespace {

// Rust's char::is_whitespace (Unicode White_Space), what Strip strips.
bool is_whitespace(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string strip(const std::string& text, bool left, bool right) {
  std::vector<char32_t> cps;
  utf8::decode(text, &cps);
  size_t begin = 0;
  size_t end = cps.size();
  while (left && begin < end && is_whitespace(cps[begin])) ++begin;
  while (right && end > begin && is_whitespace(cps[end - 1])) --end;
  if (begin == 0 && end == cps.size()) return text;
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::append(cps[i], &out);
  return out;
}

}  // namespace

Normalizer::Normalizer(const std::optional<JsonField>& field) {
  if (field) add(*field);
}

void Normalizer::add(const JsonField& field) {
  const std::string type = field.get("type").string();
  if (type == "NFC") {
    steps_.push_back([](const std::string& text) { return nfc(text); });
    // Composition and canonical singletons shorten text at most 3.5-fold: U+1FBE U+0308 U+0301
    // (7 bytes) compose to U+0390 (2 bytes), the most over every character's decompositions.
    if (max_shrink_) *max_shrink_ *= 4;
  } else if (type == "Precompiled") {
    auto map = std::make_shared<const PrecompiledCharsmap>(field);
    steps_.push_back([map](const std::string& text) { return map->normalize(text); });
    max_shrink_.reset();  // some characters map to nothing
  } else if (type == "Strip") {
    const bool left = field.get_bool("strip_left", true);
    const bool right = field.get_bool("strip_right", true);
    steps_.push_back([left, right](const std::string& text) { return strip(text, left, right); });
    max_shrink_.reset();
  } else if (type == "Replace") {
    const JsonField pattern = field.get("pattern");
    std::shared_ptr<const Pcre2Regex> regex;
    if (const auto re = pattern.find("Regex")) {
      const std::string what = re->source() + ": field '" + re->path() + "'";
      regex = std::make_shared<const Pcre2Regex>(oniguruma_to_pcre2(re->string(), what),
                                                 Pcre2Regex::Syntax::kRegex,
                                                 what + " (regex /" + re->string() + "/)");
    } else if (const auto literal = pattern.find("String")) {
      if (literal->string().empty()) literal->fail("is empty");
      regex = std::make_shared<const Pcre2Regex>(
          literal->string(), Pcre2Regex::Syntax::kLiteral,
          literal->source() + ": field '" + literal->path() + "'");
    } else {
      pattern.fail("must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string content = field.get("content").string();
    steps_.push_back([regex, content](const std::string& text) {
      std::string out;
      size_t last = 0;
      for (const auto& [begin, end] : regex->find_all(text)) {
        out.append(text, last, begin - last);
        out += content;
        last = end;
      }
      out.append(text, last, std::string::npos);
      return out;
    });
    max_shrink_.reset();
  } else if (type == "Sequence") {
    for (const JsonField& step : field.get("normalizers").items()) add(step);
  } else {
    field.get("type").fail("unsupported normalizer '" + type +
                           "' (supported: NFC, Precompiled, Strip, Replace, Sequence)");
  }
}

std::string Normalizer::normalize(std::string text) const {
  for (const auto& step : steps_) text = step(text);
  return text;
}

}  // namespace omni::models
