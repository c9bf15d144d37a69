// The tokenizer.json "normalizer": what the text between added tokens goes through first.
// Supported: none (null), NFC, and a Sequence of those; anything else (NFKC, Lowercase, Replace,
// ...) is refused at load, naming the type, rather than encoding differently.
#pragma once

#include <optional>
#include <string>

#include "json_field.h"

namespace omni::models {

class Normalizer {
 public:
  // `field` is the "normalizer" member; nullopt when absent or null.
  explicit Normalizer(const std::optional<JsonField>& field);

  // `text` must be well-formed UTF-8.
  std::string normalize(const std::string& text) const;

 private:
  void add(const JsonField& field);

  // NFC is idempotent, so any number of NFC steps in a Sequence is one.
  bool nfc_ = false;
};

}  // namespace omni::models
