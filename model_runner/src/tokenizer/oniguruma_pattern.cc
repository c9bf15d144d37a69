#include "oniguruma_pattern.h"

#include "cpu_offload/check.h"
#include "oniguruma_classes.h"

namespace omni::models {
namespace {

// Rewrites one pattern; a class of its own so that the scan state is named, not passed around.
class Translator {
 public:
  Translator(const std::string& pattern, const std::string& what) : p_(pattern), what_(what) {}

  std::string run() {
    // (*LF): only "\n" ends a line, as in Ruby; (?m): ^ and $ at line boundaries.
    out_ = "(*LF)(?m)";
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        escape();
      } else if (c == '[') {
        open_class();
      } else if (c == ']' && in_class_) {
        in_class_ = false;
        out_ += c;
        ++i_;
      } else if (c == '&' && in_class_ && next_is('&')) {
        fail("character class intersection (&&)");
      } else if (c == '(' && !in_class_ && next_is('?')) {
        group_options();
      } else {
        out_ += c;
        ++i_;
      }
    }
    if (in_class_) fail("an unterminated character class");
    return out_;
  }

 private:
  bool next_is(char c) const { return i_ + 1 < p_.size() && p_[i_ + 1] == c; }

  [[noreturn]] void fail(const std::string& construct) const {
    OMNI_THROW(what_, ": regex /", p_, "/: ", construct, " at offset ", i_,
               " is not supported (Oniguruma, which Hugging Face uses, and PCRE2 differ there)");
  }

  // A class Oniguruma extends beyond PCRE2's: `base` ("\\p{L}") plus `extras`, negated or not.
  void extended_class(const std::string& base, const char* extras, bool negated) {
    if (!in_class_) {
      out_ += (negated ? "[^" : "[") + base + extras + "]";
    } else if (!negated) {
      out_ += base + extras;
    } else {
      fail("a negated class escape inside a character class");
    }
  }

  void escape() {
    if (i_ + 1 >= p_.size()) fail("a trailing backslash");
    const char e = p_[i_ + 1];
    switch (e) {
      case 'p':
      case 'P': {
        size_t end = i_ + 3;  // \pL
        std::string name(1, i_ + 2 < p_.size() ? p_[i_ + 2] : '\0');
        if (name == "{") {
          const size_t close = p_.find('}', i_ + 3);
          if (close == std::string::npos) fail("an unterminated \\p{");
          name = p_.substr(i_ + 3, close - i_ - 3);
          end = close + 1;
        }
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') {  // \p{^L}
          negated = !negated;
          name.erase(0, 1);
        }
        if (name == "L") {
          extended_class("\\p{L}", oniguruma_classes::kLetterExtras, negated);
        } else if (name == "N") {
          extended_class("\\p{N}", oniguruma_classes::kNumberExtras, negated);
        } else {
          out_ += p_.substr(i_, end - i_);
        }
        i_ = end;
        return;
      }
      case 'd':
      case 'D':
        extended_class("\\d", oniguruma_classes::kDecimalDigitExtras, e == 'D');
        break;
      case 's':
        out_ += in_class_ ? std::string(oniguruma_classes::kSpaces)
                          : std::string("[") + oniguruma_classes::kSpaces + "]";
        break;
      case 'S':
        // Oniguruma's \S is PCRE2's plus U+180E.
        out_ += in_class_ ? std::string("\\S\\x{180E}")
                          : std::string("[^") + oniguruma_classes::kSpaces + "]";
        break;
      case 'w':
      case 'W':
      case 'b':
      case 'B':
      case 'h':
      case 'H':
        fail(std::string("\\") + e);
      case 'u': {  // Ruby's \uHHHH
        const std::string hex = p_.substr(i_ + 2, 4);
        if (hex.size() != 4 ||
            hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
          fail("\\u without four hex digits");
        }
        out_ += "\\x{" + hex + "}";
        i_ += 6;
        return;
      }
      default:
        out_ += p_.substr(i_, 2);
    }
    i_ += 2;
  }

  void open_class() {
    if (in_class_) {
      const size_t posix_end = p_.find(":]", i_);
      if (next_is(':') && posix_end != std::string::npos) {  // [:alpha:]
        out_ += p_.substr(i_, posix_end + 2 - i_);
        i_ = posix_end + 2;
        return;
      }
      fail("a nested character class");
    }
    in_class_ = true;
    out_ += '[';
    ++i_;
    if (i_ < p_.size() && p_[i_] == '^') out_ += p_[i_++];
    if (i_ < p_.size() && p_[i_] == ']') out_ += p_[i_++];  // a literal ']' first
  }

  // (?imx-imx) and (?imx-imx:...): Ruby's m is PCRE2's s (dot matches newline).
  void group_options() {
    size_t j = i_ + 2;
    while (j < p_.size() && (p_[j] == 'i' || p_[j] == 'm' || p_[j] == 'x' || p_[j] == '-')) ++j;
    const bool is_options = j > i_ + 2 && j < p_.size() && (p_[j] == ':' || p_[j] == ')');
    if (!is_options) {
      out_ += p_.substr(i_, 2);
      i_ += 2;
      return;
    }
    std::string options = p_.substr(i_ + 2, j - i_ - 2);
    for (char& o : options) {
      if (o == 'm') o = 's';
    }
    out_ += "(?" + options;
    i_ = j;
  }

  const std::string& p_;
  const std::string& what_;
  std::string out_;
  size_t i_ = 0;
  bool in_class_ = false;
};

}  // namespace

std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& what) {
  return Translator(pattern, what).run();
}

}  // namespace omni::models
