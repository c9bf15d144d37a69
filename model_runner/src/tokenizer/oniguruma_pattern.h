// Hugging Face `tokenizers` compiles pre-tokenizer regexes with Oniguruma in Ruby syntax; this
// rewrites one for PCRE2 so that it matches the same text:
//  - \p{L}, \p{N}, \d (and \P{L}, \P{N}, \D) get the characters Oniguruma's newer Unicode data
//    adds, \s and \S lose U+180E (oniguruma_classes.h);
//  - ^ and $ match at line boundaries and an inline (?m) is dot-all, as in Ruby;
// and refuses what it cannot make equal, naming the construct: \w, \W, \b, \B, \h, \H (their
// Unicode meaning differs), \P{L} / \P{N} / \D inside a character class, nested classes and
// class intersection (&&). Other Unicode properties (\p{Lu}, \p{Han}) keep PCRE2's Unicode
// 14.0 data: characters assigned since may be classified differently.
#pragma once

#include <string>

namespace omni::models {

// `what` names the pattern (file and field) in errors.
std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& what);

}  // namespace omni::models
