// Turns generated token ids into text as they arrive, for streaming a reply to a terminal or a
// socket. Byte-level BPE tokens are bytes, not characters: "é" or an emoji is often split over
// two or three tokens, and decoding each token alone would print U+FFFD for every piece. The
// decoder holds back the bytes of a character until it is complete.
#pragma once

#include <cstdint>
#include <string>

#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// Concatenating push(t1) ... push(tn) and finish() gives exactly tokenizer.decode({t1..tn},
// /*skip_special=*/true): special added tokens (<|im_end|>, ...) are skipped, ids that name no
// token are dropped, and bytes that are not UTF-8 become U+FFFD as decode makes them. Each call
// costs O(bytes of the token): nothing is decoded twice.
class TextStreamDecoder {
 public:
  // The decoder keeps a copy of `tokenizer` (copies share the loaded vocabulary).
  explicit TextStreamDecoder(const Tokenizer& tokenizer);

  // The text that `token` completes: whole UTF-8 characters only, each returned once. A
  // character whose bytes are still incomplete waits for the next token; a byte sequence that
  // can no longer become a valid character is returned as U+FFFD right away.
  std::string push(int64_t token);
  // What is left (an incomplete character at the end becomes one U+FFFD, as decode() makes
  // it); the decoder is then empty and can start a new stream.
  std::string finish();

 private:
  Tokenizer tokenizer_;
  // Bytes of a character started but not complete yet: at most 3.
  std::string pending_;
};

}  // namespace omni::models
