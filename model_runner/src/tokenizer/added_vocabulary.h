// The `added_tokens` of a tokenizer.json (`<|im_start|>`, `<tool_call>`, ...): tokens matched
// verbatim in the text before any pre-tokenization, so that BPE never splits them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "json_field.h"

namespace omni::models {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  // Special tokens (control markers) can be skipped when decoding and refused when encoding.
  bool special = false;
  // Matched in the normalized text rather than the raw text.
  bool normalized = false;
};

// A piece of text between added tokens (`token_id` < 0), or an added token's match.
struct TextPiece {
  std::string_view text;
  int32_t token_id = -1;
};

// Finds added tokens in text the way Hugging Face's aho-corasick matcher does: the leftmost
// match, the longest among those starting there, then on from its end.
class AddedTokenMatcher {
 public:
  // `pattern` is what the token matches: its content, or the normalized content.
  void add(std::string pattern, int32_t id, bool special);

  // `text` cut into gaps and matches, handed to `fn` in order as they are found, gaps never
  // empty. Matches of special tokens stay in the text unless `match_special`; they are still
  // skipped over, as Hugging Face does (so a shorter token inside one does not match).
  void split(std::string_view text, bool match_special,
             const std::function<void(const TextPiece&)>& fn) const;

 private:
  struct Target {
    int32_t id;
    bool special;
  };
  std::unordered_map<std::string, Target> by_pattern_;
  std::vector<size_t> lengths_;  // the distinct pattern lengths, longest first
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  // `added_tokens` (nullopt: none). `normalize` maps the content of a token marked
  // "normalized" to what it matches.
  static AddedVocabulary parse(const std::optional<JsonField>& added_tokens,
                               const std::function<std::string(const std::string&)>& normalize);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find(const std::string& content) const;
  const AddedToken* find(int32_t id) const;
  bool is_special_content(const std::string& content) const {
    return special_contents_.count(content) > 0;
  }

  // Pass 1 (raw text): the tokens with "normalized": false. Pass 2 (each normalized gap of
  // pass 1): those with "normalized": true.
  const AddedTokenMatcher& raw_matcher() const { return raw_; }
  const AddedTokenMatcher& normalized_matcher() const { return normalized_; }

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_set<std::string> special_contents_;
  AddedTokenMatcher raw_;
  AddedTokenMatcher normalized_;
};

}  // namespace omni::models
