// The BPE model of a tokenizer.json: a vocabulary of token strings and the ranked merges that
// build them from single characters (for byte-level BPE, from the 256 byte stand-ins).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_field.h"

namespace omni::models {

class BpeModel {
 public:
  // `model` is the tokenizer.json "model" object with "type": "BPE".
  explicit BpeModel(const JsonField& model);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-tokenized word. Characters outside the vocabulary become the
  // unknown token, or are dropped when there is none (as Hugging Face does). Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  size_t size() const { return vocab_.size(); }
  // The most characters of any vocabulary token: with every character of a word in the
  // vocabulary, a word of n characters makes at least n / max_token_chars() tokens.
  size_t max_token_chars() const { return max_token_chars_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void parse_vocab(const JsonField& vocab);
  void parse_merges(const JsonField& merges);
  std::vector<int32_t> merge_word(std::string_view word) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<int32_t, const std::string*> tokens_by_id_;  // points into vocab_'s keys
  std::unordered_map<uint64_t, Merge> merges_;                    // by (left id, right id)
  size_t max_token_chars_ = 0;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Words recur (" the", " of"), and merging is the expensive part of encoding: their ids are
  // cached. Like Hugging Face, the cache stops growing when full.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace omni::models
