// UTF-8 scanning for the tokenizer: validation with the offending byte, code points in and out,
// and the lossy conversion byte-level decoding ends with.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace omni::models::utf8 {

// Length of the character starting at text[pos] when it is well-formed UTF-8 (1-4), else 0.
// Well-formed excludes overlong forms, surrogates and code points above U+10FFFF.
size_t char_length(std::string_view text, size_t pos);

// Offset of the first byte that starts no well-formed character; npos when there is none.
size_t find_invalid(std::string_view text);

// The number of characters in well-formed `text`.
size_t count_chars(std::string_view text);

// The code points of well-formed `text` (see find_invalid), appended to `out`.
void decode(std::string_view text, std::vector<char32_t>* out);
void append(char32_t cp, std::string* out);

// `bytes` as UTF-8 with each maximal ill-formed subsequence replaced by U+FFFD: Unicode's
// recommended practice, and what Rust's String::from_utf8_lossy (so Hugging Face's byte-level
// decoder) does. A token stream cut in the middle of a character ends in one U+FFFD.
std::string to_valid_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that to_valid_lossy converts the same way whatever
// bytes come after it: everything but a last character that more bytes could still complete.
// For streaming: emit to_valid_lossy(prefix), keep the rest for the next bytes.
size_t stable_prefix(std::string_view bytes);

}  // namespace omni::models::utf8
