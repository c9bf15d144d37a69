#include "model_runner/tokenizer/text_stream.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "byte_level.h"
#include "utf8.h"

namespace omni::models {
namespace {

enum class Unit { kComplete, kIllFormed, kUnfinished };

// The unit of utf8::to_valid_lossy that starts at bytes[pos]: a well-formed character, or a
// maximal ill-formed subpart (one U+FFFD), or, when the bytes run out before either is decided,
// the start of a character that later bytes may still complete. Same rules as to_valid_lossy
// (Unicode's maximal subparts: the lead byte fixes the length and narrows the second byte's
// range against overlongs, surrogates and code points above U+10FFFF).
Unit scan_unit(std::string_view bytes, size_t pos, size_t* length) {
  const size_t avail = bytes.size() - pos;
  const auto at = [&](size_t i) { return static_cast<unsigned char>(bytes[pos + i]); };
  const unsigned char lead = at(0);
  *length = 1;
  if (lead < 0x80) return Unit::kComplete;
  size_t need;
  unsigned char second_lo = 0x80, second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) second_lo = 0xA0;
    if (lead == 0xED) second_hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) second_lo = 0x90;
    if (lead == 0xF4) second_hi = 0x8F;
  } else {
    return Unit::kIllFormed;
  }
  if (avail < 2) return Unit::kUnfinished;
  if (at(1) < second_lo || at(1) > second_hi) return Unit::kIllFormed;
  size_t have = 2;
  while (have < need && have < avail && (at(have) & 0xC0) == 0x80) ++have;
  *length = have;
  if (have == need) return Unit::kComplete;
  return have == avail ? Unit::kUnfinished : Unit::kIllFormed;
}

}  // namespace

TextStreamDecoder::TextStreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

std::string TextStreamDecoder::push(int64_t token) {
  // As decode(): ids that name no token (those beyond int32 included) are dropped, and so are
  // special tokens; the bytes around a skipped token join as they do in decode().
  if (token < 0 || token > std::numeric_limits<int32_t>::max()) return {};
  const auto id = static_cast<int32_t>(token);
  const std::optional<std::string> text = tokenizer_.id_to_token(id);
  if (!text || tokenizer_.is_special(id)) return {};
  // A token outside the byte-level alphabet stands for its own UTF-8, as in decode().
  if (!byte_level::decode(*text, &pending_)) pending_ += *text;

  // Each unit is decided by its own bytes and the one after it, so the units found here are the
  // ones decode() finds in the whole stream; only an unfinished last one waits for more bytes.
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t length;
    if (scan_unit(pending_, pos, &length) == Unit::kUnfinished) break;
    pos += length;
  }
  std::string out = utf8::to_valid_lossy(std::string_view(pending_).substr(0, pos));
  pending_.erase(0, pos);
  return out;
}

std::string TextStreamDecoder::finish() {
  std::string out = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace omni::models
