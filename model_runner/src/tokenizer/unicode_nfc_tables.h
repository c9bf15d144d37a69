// The Unicode data NFC needs, generated into unicode_nfc_tables.cc by
// make_unicode_nfc_tables.py. Both arrays are sorted by code point.
#pragma once

#include <cstddef>
#include <cstdint>

namespace omni::models::unicode_tables {

// Code points first..last have canonical combining class `ccc` (all others: 0).
struct CombiningClassRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
};

// One level of a canonical decomposition: `cp` -> `first` (+ `second` unless 0). `composes`:
// NFC recombines `first` `second` into `cp` (false for singletons, non-starter decompositions
// and the composition exclusions). Hangul syllables are algorithmic and not listed.
struct CanonicalDecomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
  bool composes;
};

extern const CombiningClassRange kCombiningClasses[];
extern const size_t kNumCombiningClasses;
extern const CanonicalDecomposition kDecompositions[];
extern const size_t kNumDecompositions;

}  // namespace omni::models::unicode_tables
