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
  std::string normalize(const std::string& text) const;

 private:
  void add(const JsonField& field);

  // The steps in order.
  std::vector<std::function<std::string(const std::string&)>> steps_;
};

}  // namespace omni::models
