// TextStreamDecoder: streamed text equals Tokenizer::decode(all tokens, skip_special) for any
// token sequence, and a character split over tokens comes out once, whole, when complete.
// Runs on the committed tokenizer fixture, whose vocabulary holds all 256 byte tokens and
// merged tokens that end or start inside a UTF-8 character ("ãģ", "ðŁ", "ĠðŁĺ", ...).
#include "model_runner/tokenizer/text_stream.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "byte_level.h"  // model_runner/src/tokenizer: the byte -> token-string alphabet
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

const Tokenizer& fixture() {
  static const Tokenizer tokenizer = Tokenizer::load(std::string(OMNI_FIXTURES_DIR) + "/tokenizer");
  return tokenizer;
}

// The id of the token that is exactly the byte `b`.
int64_t byte_token(unsigned char b) {
  std::string token;
  byte_level::encode(std::string(1, static_cast<char>(b)), &token);
  return fixture().token_id(token);
}

std::vector<int64_t> byte_tokens(const std::string& bytes) {
  std::vector<int64_t> ids;
  for (const char c : bytes) ids.push_back(byte_token(static_cast<unsigned char>(c)));
  return ids;
}

struct Streamed {
  std::vector<std::string> pieces;  // push() results, then finish()'s
  std::string text;
};

Streamed stream(const std::vector<int64_t>& ids) {
  TextStreamDecoder decoder(fixture());
  Streamed out;
  for (const int64_t id : ids) out.pieces.push_back(decoder.push(id));
  out.pieces.push_back(decoder.finish());
  for (const auto& piece : out.pieces) out.text += piece;
  return out;
}

// What decode() makes of `ids`; it takes int32 ids, and ids beyond int32 name no token.
std::string decoded(const std::vector<int64_t>& ids) {
  std::vector<int32_t> narrow;
  for (const int64_t id : ids) {
    if (id >= std::numeric_limits<int32_t>::min() && id <= std::numeric_limits<int32_t>::max()) {
      narrow.push_back(static_cast<int32_t>(id));
    }
  }
  return fixture().decode(narrow, /*skip_special=*/true);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TextStream, ASplitCharacterComesOutOnceWhenComplete) {
  // "é" = C3 A9, "日" = E6 97 A5, "😀" = F0 9F 98 80, one byte token each.
  for (const std::string ch : {"\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80"}) {
    TextStreamDecoder decoder(fixture());
    const auto ids = byte_tokens(ch);
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      EXPECT_EQ(decoder.push(ids[i]), "") << "byte " << i << " of " << ch;
    }
    EXPECT_EQ(decoder.push(ids.back()), ch);
    EXPECT_EQ(decoder.finish(), "");
  }
}

TEST(TextStream, MergedTokensThatSplitCharactersStreamCleanly) {
  const std::vector<std::string> texts = {
      "Café, naïve résumé", "日本語のテキスト、世界。", "Hello 😀👍🏽 world 🚀!",
      "مرحبا بالعالم",      "Ünïcödé ∑ x² ≤ ∞",         "a😀b日c\xC3\xA9"};
  size_t held_back = 0;  // pushes that returned nothing: a character waits for its next bytes
  for (const auto& text : texts) {
    std::vector<int64_t> ids;
    for (const int32_t id : fixture().encode(text)) ids.push_back(id);
    const Streamed s = stream(ids);
    EXPECT_EQ(s.text, text);
    for (size_t i = 0; i < s.pieces.size(); ++i) {
      EXPECT_FALSE(contains(s.pieces[i], kReplacement)) << text;
      held_back += i + 1 < s.pieces.size() && s.pieces[i].empty();
    }
  }
  // The fixture splits many of these characters over tokens, so that case is exercised.
  EXPECT_GT(held_back, 10u);
}

TEST(TextStream, SpecialTokensAreSkippedAndOthersKept) {
  const auto& tok = fixture();
  TextStreamDecoder decoder(tok);
  EXPECT_EQ(decoder.push(tok.token_id("<|im_start|>")), "");
  EXPECT_EQ(decoder.push(tok.token_id("Hello")), "Hello");
  EXPECT_EQ(decoder.push(tok.token_id("<|im_end|>")), "");      // the stop token is never printed
  EXPECT_EQ(decoder.push(tok.token_id("<think>")), "<think>");  // added but not special
  EXPECT_EQ(decoder.push(5000), "");                            // no such token
  EXPECT_EQ(decoder.push(-1), "");
  EXPECT_EQ(decoder.push(int64_t{1} << 40), "");
  EXPECT_EQ(decoder.finish(), "");
}

TEST(TextStream, ACharacterSplitAroundASkippedTokenJoinsAsInDecode) {
  const auto& tok = fixture();
  const std::vector<int64_t> ids = {byte_token(0xC3), tok.token_id("<|im_end|>"), byte_token(0xA9)};
  const Streamed s = stream(ids);
  EXPECT_EQ(s.text, "\xC3\xA9");
  EXPECT_EQ(s.text, decoded(ids));
}

TEST(TextStream, InvalidBytesBecomeReplacementCharactersLikeDecode) {
  struct Case {
    std::string bytes;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"\xC3"
       "a",
       kReplacement + "a"},                       // lead byte, then ASCII
      {"\xE0\x80", kReplacement + kReplacement},  // overlong: two maximal subparts
      {"\xED\xA0\x80", kReplacement + kReplacement + kReplacement},  // a surrogate
      {"\xF0\x9F\x98", kReplacement},  // cut short at the end: one U+FFFD
      {"\xF0\x9F"
       "A\x80",
       kReplacement + "A" + kReplacement},
      {"\xFF\xC3\xA9", kReplacement + "\xC3\xA9"},
      {"\xF4\x90\x80\x80", kReplacement + kReplacement + kReplacement + kReplacement},
  };
  for (const auto& c : cases) {
    const auto ids = byte_tokens(c.bytes);
    EXPECT_EQ(decoded(ids), c.expected);  // the reference itself
    EXPECT_EQ(stream(ids).text, c.expected);
  }
  // An ill-formed byte comes out as soon as it is known to be one, not at finish().
  TextStreamDecoder decoder(fixture());
  EXPECT_EQ(decoder.push(byte_token(0xC3)), "");
  EXPECT_EQ(decoder.push(byte_token('x')), kReplacement + "x");
}

TEST(TextStream, FinishFlushesAnIncompleteCharacterAndResets) {
  TextStreamDecoder decoder(fixture());
  EXPECT_EQ(decoder.push(byte_token(0xE6)), "");
  EXPECT_EQ(decoder.push(byte_token(0x97)), "");
  EXPECT_EQ(decoder.finish(), kReplacement);
  // A new stream starts clean.
  EXPECT_EQ(decoder.push(byte_token(0xA5)), kReplacement);
  EXPECT_EQ(decoder.push(byte_token('o')), "o");
  EXPECT_EQ(decoder.finish(), "");
}

// The property, on random sequences drawn from the whole vocabulary with extra weight on the
// tokens that cut characters, on byte tokens >= 0x80, on special tokens and on ids that name
// no token.
TEST(TextStream, EqualsDecodeOnRandomSequences) {
  const auto& tok = fixture();
  const auto vocab = static_cast<int64_t>(tok.vocab_size()) + 16;  // a few ids past the end
  std::vector<int64_t> cutting;  // tokens whose bytes are not whole characters
  for (int32_t id = 0; id < vocab; ++id) {
    if (contains(tok.decode({id}), kReplacement)) cutting.push_back(id);
  }
  ASSERT_GT(cutting.size(), 20u);
  std::vector<int64_t> high_bytes;
  for (int b = 0x80; b < 0x100; ++b)
    high_bytes.push_back(byte_token(static_cast<unsigned char>(b)));
  const std::vector<int64_t> odd = {tok.token_id("<|im_end|>"),
                                    tok.token_id("<|endoftext|>"),
                                    tok.token_id("<think>"),
                                    -7,
                                    100000,
                                    int64_t{1} << 33};

  std::mt19937_64 rng(20240611);
  const auto pick = [&](const std::vector<int64_t>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t length = std::uniform_int_distribution<size_t>(0, 40)(rng);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < length; ++i) {
      switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
        case 0:
          ids.push_back(std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
          break;
        case 1:
          ids.push_back(pick(cutting));
          break;
        case 2:
          ids.push_back(pick(high_bytes));
          break;
        default:
          ids.push_back(rng() % 8 == 0 ? pick(odd) : pick(cutting));
          break;
      }
    }
    const Streamed s = stream(ids);
    ASSERT_EQ(s.text, decoded(ids)) << "trial " << trial;
  }
}

// Every sequence of 4 byte tokens over bytes chosen to hit each UTF-8 rule (ASCII,
// continuation ranges, every kind of lead byte, the invalid ones).
TEST(TextStream, EqualsDecodeOnEveryShortByteSequence) {
  const std::vector<unsigned char> bytes = {'a',  0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF,
                                            0xC0, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF,
                                            0xF0, 0xF1, 0xF4, 0xF5, 0xFF};
  std::vector<int64_t> ids;
  for (const unsigned char b : bytes) ids.push_back(byte_token(b));
  std::vector<int64_t> seq;
  size_t checked = 0;
  for (const int64_t a : ids) {
    for (const int64_t b : ids) {
      for (const int64_t c : ids) {
        for (const int64_t d : ids) {
          seq = {a, b, c, d};
          ASSERT_EQ(stream(seq).text, decoded(seq));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, bytes.size() * bytes.size() * bytes.size() * bytes.size());
}

// Linear work: a long reply streams in well under a second (re-decoding everything at each
// step would take minutes here).
TEST(TextStream, LongStreamsStayLinear) {
  std::vector<int64_t> ids;
  for (const int32_t id : fixture().encode("Hello 😀 日本語 world, ")) ids.push_back(id);
  std::vector<int64_t> all;
  for (int i = 0; i < 20000; ++i) all.insert(all.end(), ids.begin(), ids.end());
  TextStreamDecoder decoder(fixture());
  std::string text;
  for (const int64_t id : all) text += decoder.push(id);
  text += decoder.finish();
  EXPECT_EQ(text, decoded(all));
}

}  // namespace
}  // namespace omni::models
