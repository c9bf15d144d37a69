// The tokenizer.json "normalizer": what the text between added tokens goes through first.
// Supported: none (null), NFC, Precompiled (SentencePiece's charsmap, precompiled_charsmap.h),
// Strip (Unicode whitespace, either side), Replace (String or Regex pattern; what Hugging Face's
// SentencePiece converters add: " {2,}" -> "▁" or " "), and a Sequence of those; anything else
// (NFKC, Lowercase, Replace, ...) is refused at load, naming the type, rather than encoding
// differently.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "json_field.h"
#include "precompiled_charsmap.h"

namespace omni::models {

class Normalizer {
 public:
  // `field` is the "normalizer" member; nullopt when absent or null.
  explicit Normalizer(const std::optional<JsonField>& field);

  // `text` must be well-formed UTF-8.
  std::string normalize(std::string text) const;

  // How many times shorter normalize() can make a text, at most: a text of n bytes normalizes
  // to at least n / max_shrink() bytes. nullopt when it can delete text of any length (Strip,
  // Replace, a Precompiled charsmap).
  std::optional<size_t> max_shrink() const { return max_shrink_; }

 private:
  void add(const JsonField& field);

  // The steps in order.
  std::vector<std::function<std::string(const std::string&)>> steps_;
  std::optional<size_t> max_shrink_ = 1;
};

}  // namespace omni::models
