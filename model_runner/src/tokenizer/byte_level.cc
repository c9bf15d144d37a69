#include "byte_level.h"

#include <array>
#include <vector>

#include "utf8.h"

namespace omni::models::byte_level {
namespace {

// GPT-2's bytes_to_unicode(), built once: the stand-in of each byte (UTF-8) and the reverse.
struct Alphabet {
  static constexpr char32_t kNumCodePoints = 0x100 + 68;  // stand-ins lie below this

  std::array<std::string, 256> stand_in;
  std::array<int, kNumCodePoints> byte_of;  // -1: not a stand-in

  Alphabet() {
    byte_of.fill(-1);
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      utf8::append(cp, &stand_in[b]);
      byte_of[cp] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

void encode(std::string_view bytes, std::string* out) {
  const Alphabet& a = alphabet();
  for (const char c : bytes) *out += a.stand_in[static_cast<unsigned char>(c)];
}

bool decode(std::string_view token, std::string* out) {
  const Alphabet& a = alphabet();
  std::vector<char32_t> cps;
  utf8::decode(token, &cps);  // token strings come from validated JSON text
  std::string bytes;
  bytes.reserve(cps.size());
  for (const char32_t cp : cps) {
    if (cp >= Alphabet::kNumCodePoints || a.byte_of[cp] < 0) return false;
    bytes.push_back(static_cast<char>(a.byte_of[cp]));
  }
  *out += bytes;
  return true;
}

}  // namespace omni::models::byte_level
