// The "Precompiled" normalizer of a tokenizer.json (SentencePiece's compiled normalization
// rules, e.g. nmt_nfkc, as T5 / UMT5 tokenizers carry them), applied as Hugging Face's
// `tokenizers` applies it: the text is cut into grapheme clusters; a cluster shorter than 6
// bytes is looked up whole, else (or when that finds nothing) each of its characters is looked
// up alone; a lookup takes the SHORTEST rule key that prefixes the string (Darts'
// common_prefix_search, first result), and what is not found is kept.
//
// Grapheme clusters are approximated: a character followed by characters of nonzero canonical
// combining class, variation selectors, ZWNJ / ZWJ, emoji skin-tone modifiers or tag characters
// (and CR LF, and ZWJ followed by a pictographic character) forms one cluster, never across a
// control character (C0 / C1, U+2028-202E, ZWSP, SHY, BOM and other format characters). Hangul jamo
// sequences, regional-indicator pairs, prepend characters and spacing marks (category Mc of
// class 0) are not joined as Unicode's extended grapheme clusters would join them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "json_field.h"

namespace omni::models {

class PrecompiledCharsmap {
 public:
  // `field` is the normalizer object; its "precompiled_charsmap" is base64.
  explicit PrecompiledCharsmap(const JsonField& field);

  // `text` must be well-formed UTF-8.
  std::string normalize(std::string_view text) const;

 private:
  // The replacement of the shortest rule key prefixing `key`, or nullptr.
  const char* transform(std::string_view key) const;

  std::vector<uint32_t> trie_;  // Darts double-array units
  std::string normalized_;      // NUL-terminated replacements, indexed by the trie's values
};

}  // namespace omni::models
