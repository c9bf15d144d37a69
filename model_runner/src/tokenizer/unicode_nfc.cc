#include "unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "unicode_nfc_tables.h"
#include "utf8.h"

namespace omni::models {
namespace {

using unicode_tables::CanonicalDecomposition;

// Hangul syllables compose and decompose arithmetically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Every character below U+0300 has class 0, decomposes only into characters that recompose to
// it, and is no second half of a composition: such text is NFC as it stands.
constexpr char32_t kFirstNonTrivial = 0x300;

uint8_t combining_class(char32_t cp) {
  if (cp < kFirstNonTrivial) return 0;
  const auto* begin = unicode_tables::kCombiningClasses;
  const auto* end = begin + unicode_tables::kNumCombiningClasses;
  const auto* it = std::lower_bound(begin, end, cp,
                                    [](const auto& range, char32_t c) { return range.last < c; });
  return it != end && it->first <= cp ? it->ccc : 0;
}

const CanonicalDecomposition* find_decomposition(char32_t cp) {
  const auto* begin = unicode_tables::kDecompositions;
  const auto* end = begin + unicode_tables::kNumDecompositions;
  const auto* it =
      std::lower_bound(begin, end, cp, [](const auto& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (const CanonicalDecomposition* d = find_decomposition(cp)) {
    decompose(d->first, out);  // decompositions nest (U+1E08 -> U+00C7 U+0301 -> C U+0327 U+0301)
    if (d->second != 0) decompose(d->second, out);
    return;
  }
  out->push_back(cp);
}

uint64_t pair_key(char32_t a, char32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

// Primary composites by their two halves.
const std::unordered_map<uint64_t, char32_t>& compositions() {
  static const auto* map = [] {
    auto* m = new std::unordered_map<uint64_t, char32_t>();
    for (size_t i = 0; i < unicode_tables::kNumDecompositions; ++i) {
      const CanonicalDecomposition& d = unicode_tables::kDecompositions[i];
      if (d.composes) m->emplace(pair_key(d.first, d.second), d.cp);
    }
    return m;
  }();
  return *map;
}

// The composite of `a` and `b`, or 0 when there is none.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& map = compositions();
  const auto it = map.find(pair_key(a, b));
  return it == map.end() ? 0 : it->second;
}

// Canonical ordering: each run of non-starters sorted by class, stably.
void reorder(std::vector<char32_t>* cps) {
  auto& v = *cps;
  for (size_t i = 0; i < v.size();) {
    if (combining_class(v[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < v.size() && combining_class(v[end]) != 0) ++end;
    std::stable_sort(v.begin() + i, v.begin() + end, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = end;
  }
}

// Canonical composition of a decomposed, reordered sequence. A character combines with the last
// starter unless something left between them has class 0 or a class >= its own; after
// reordering, the last character kept has the largest class of those in between.
std::vector<char32_t> compose_all(const std::vector<char32_t>& cps) {
  std::vector<char32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;  // index in `out`
  uint8_t last_class = 0;
  for (const char32_t cp : cps) {
    const uint8_t cls = combining_class(cp);
    if (starter != SIZE_MAX && (starter + 1 == out.size() || last_class < cls)) {
      if (const char32_t composite = compose(out[starter], cp)) {
        out[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(cp);
  }
  return out;
}

}  // namespace

std::string nfc(const std::string& text) {
  // The lead byte of U+0300 is 0xCC; every byte of text below U+0300 is smaller.
  const bool trivial = std::all_of(text.begin(), text.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  if (trivial) return text;

  std::vector<char32_t> cps;
  utf8::decode(text, &cps);
  std::vector<char32_t> decomposed;
  decomposed.reserve(cps.size());
  for (const char32_t cp : cps) decompose(cp, &decomposed);
  reorder(&decomposed);
  std::string out;
  out.reserve(text.size());
  for (const char32_t cp : compose_all(decomposed)) utf8::append(cp, &out);
  return out;
}

}  // namespace omni::models
