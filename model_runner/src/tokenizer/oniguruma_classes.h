// Where Oniguruma's Unicode classes (Hugging Face `tokenizers`, Unicode 16.0) differ from
// PCRE2's (Debian 12: 10.42, Unicode 14.0), as items to splice into a PCRE2 character class.
// Generated into oniguruma_classes.cc by make_oniguruma_classes.py.
#pragma once

namespace omni::models::oniguruma_classes {

// Letters, numbers and decimal digits assigned after Unicode 14.0: \p{L}, \p{N} and \d there,
// unassigned in PCRE2 10.42 (the CJK extensions H and I among them).
extern const char* const kLetterExtras;
extern const char* const kNumberExtras;
extern const char* const kDecimalDigitExtras;
// Every character Oniguruma's \s matches: PCRE2's \s less U+180E MONGOLIAN VOWEL SEPARATOR.
extern const char* const kSpaces;

}  // namespace omni::models::oniguruma_classes
