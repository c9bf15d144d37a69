// Unicode Normalization Form C, as Hugging Face's `NFC` normalizer computes it: with Unicode
// 9.0 data (characters assigned later have class 0 and no decomposition there, so they are
// left alone; see make_unicode_nfc_tables.py, whose --check-hf compares the tables with the
// `tokenizers` library on every code point).
#pragma once

#include <string>

namespace omni::models {

// `text` must be well-formed UTF-8. Text that is already NFC, and in particular every string
// of code points below U+0300 (ASCII, Latin-1), comes back unchanged.
std::string nfc(const std::string& text);

}  // namespace omni::models
