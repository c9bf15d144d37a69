#include "added_vocabulary.h"

#include <algorithm>

namespace omni::models {

void AddedTokenMatcher::add(std::string pattern, int32_t id, bool special) {
  const size_t length = pattern.size();
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  if (!by_pattern_.emplace(std::move(pattern), Target{id, special}).second) return;
  if (std::find(lengths_.begin(), lengths_.end(), length) == lengths_.end()) {
    lengths_.push_back(length);
    std::sort(lengths_.rbegin(), lengths_.rend());
  }
}

void AddedTokenMatcher::split(std::string_view text, bool match_special,
                              const std::function<void(const TextPiece&)>& fn) const {
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const Target* target = nullptr;
    size_t length = 0;
    if (first_byte_[static_cast<unsigned char>(text[pos])]) {
      for (const size_t n : lengths_) {  // longest first
        if (n > text.size() - pos) continue;
        const auto it = by_pattern_.find(std::string(text.substr(pos, n)));
        if (it != by_pattern_.end()) {
          target = &it->second;
          length = n;
          break;
        }
      }
    }
    if (target == nullptr) {
      ++pos;  // patterns are UTF-8, so a match can only start on a character boundary anyway
      continue;
    }
    if (target->special && !match_special) {
      pos += length;
      continue;
    }
    if (gap_start < pos) fn({text.substr(gap_start, pos - gap_start), -1});
    fn({text.substr(pos, length), target->id});
    pos += length;
    gap_start = pos;
  }
  if (gap_start < text.size()) fn({text.substr(gap_start), -1});
}

AddedVocabulary AddedVocabulary::parse(
    const std::optional<JsonField>& added_tokens,
    const std::function<std::string(const std::string&)>& normalize) {
  AddedVocabulary vocab;
  if (!added_tokens) return vocab;
  for (const JsonField& field : added_tokens->items()) {
    AddedToken token;
    token.content = field.get("content").string();
    const int64_t id = field.get("id").integer();
    if (id < 0 || id > INT32_MAX) field.get("id").fail("must be in [0, 2^31)");
    token.id = static_cast<int32_t>(id);
    token.special = field.get_bool("special", false);
    token.normalized = field.get_bool("normalized", !token.special);
    if (token.content.empty()) field.get("content").fail("is empty");
    for (const char* option : {"lstrip", "rstrip", "single_word"}) {
      if (field.get_bool(option, false)) {
        field.get(option).fail("true is not supported (token '" + token.content + "')");
      }
    }
    if (vocab.by_content_.count(token.content)) continue;  // Hugging Face keeps the first
    if (const auto it = vocab.by_id_.find(token.id); it != vocab.by_id_.end()) {
      field.get("id").fail("id " + std::to_string(token.id) + " of '" + token.content +
                           "' is also the id of '" + vocab.tokens_[it->second].content + "'");
    }
    vocab.by_content_.emplace(token.content, vocab.tokens_.size());
    vocab.by_id_.emplace(token.id, vocab.tokens_.size());
    if (token.special) vocab.special_contents_.insert(token.content);
    vocab.tokens_.push_back(std::move(token));
  }
  for (const AddedToken& token : vocab.tokens_) {
    if (token.normalized) {
      const std::string pattern = normalize(token.content);
      if (!pattern.empty()) vocab.normalized_.add(pattern, token.id, token.special);
    } else {
      vocab.raw_.add(token.content, token.id, token.special);
    }
  }
  return vocab;
}

const AddedToken* AddedVocabulary::find(const std::string& content) const {
  const auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace omni::models
