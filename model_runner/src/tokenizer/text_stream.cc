#include "model_runner/tokenizer/text_stream.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "byte_level.h"
#include "utf8.h"

namespace omni::models {

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

  // The units decided so far are the ones decode() finds in the whole stream; only an
  // unfinished last character waits for more bytes.
  const size_t pos = utf8::stable_prefix(pending_);
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
