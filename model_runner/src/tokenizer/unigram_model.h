// The Unigram model of a tokenizer.json (SentencePiece's unigram language model: T5, UMT5): a
// vocabulary of pieces with log-probability scores; a word is cut into the pieces of highest
// total score (Viterbi), exactly as Hugging Face's `tokenizers` cuts it: a character no piece
// covers costs (lowest score - 10) and becomes the unknown piece, consecutive unknown pieces
// are fused into one, and with `byte_fallback` an unknown piece becomes its bytes' <0xXX>
// pieces when they all exist.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_field.h"

namespace omni::models {

class UnigramModel {
 public:
  // `model` is the tokenizer.json "model" object with "type": "Unigram".
  explicit UnigramModel(const JsonField& model);
  UnigramModel(const UnigramModel&) = delete;
  UnigramModel& operator=(const UnigramModel&) = delete;

  // Appends the ids of one pre-tokenized word (well-formed UTF-8). Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  size_t size() const { return pieces_.size(); }

 private:
  std::vector<std::string> pieces_;                    // by id
  std::vector<double> scores_;                         // by id
  std::unordered_map<std::string_view, int32_t> ids_;  // views into pieces_
  size_t max_piece_bytes_ = 0;
  double unk_score_ = 0;  // lowest score - 10, Hugging Face's K_UNK_PENALTY
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
};

}  // namespace omni::models
