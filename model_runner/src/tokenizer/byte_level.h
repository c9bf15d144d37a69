// GPT-2's byte-level alphabet: every byte has a printable stand-in character (printable ASCII
// and Latin-1 stand for themselves, the other 68 bytes for U+0100..U+0143; a space is "Ġ"), so
// BPE works on bytes while the vocabulary stays valid UTF-8 text.
#pragma once

#include <string>
#include <string_view>

namespace omni::models::byte_level {

// Appends the stand-ins of `bytes` to `out`.
void encode(std::string_view bytes, std::string* out);

// Appends the bytes that token string `token` stands for to `out`; false (and `out` untouched)
// when `token` has a character outside the alphabet.
bool decode(std::string_view token, std::string* out);

}  // namespace omni::models::byte_level
