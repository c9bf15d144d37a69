// The pre-tokenizer's regular expressions on PCRE2, in Unicode mode (PCRE2_UTF | PCRE2_UCP:
// \p{L}, \s, \w and case-insensitive matching by Unicode properties, as Oniguruma matches in
// Hugging Face `tokenizers`), JIT-compiled when PCRE2 has a JIT for this machine.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace omni::models {

class Pcre2Regex {
 public:
  enum class Syntax { kRegex, kLiteral };

  // `what` names the pattern's origin (file and field) in errors.
  Pcre2Regex(const std::string& pattern, Syntax syntax, std::string what);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // The matches in well-formed UTF-8 `text` as [begin, end) byte offsets, left to right and
  // non-overlapping. An empty match is kept unless it ends where the previous match ended (then
  // the search moves on by one character), like the Oniguruma iterator Hugging Face uses.
  // Thread-safe.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // The same matches handed to `fn(begin, end)` one at a time, as they are found: a long text
  // costs no list of all its matches, and `fn` may stop the search by throwing.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& fn) const;

  bool jit() const { return jit_; }

 private:
  // Start of the first match at or after `start`; false when there is none.
  bool search(std::string_view text, size_t start, void* match_data, size_t* begin,
              size_t* end) const;

  void* code_;  // pcre2_code_8*, kept out of this header so that pcre2.h stays private
  bool jit_ = false;
  std::string what_;
};

}  // namespace omni::models
