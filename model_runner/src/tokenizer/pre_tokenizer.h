// The tokenizer.json "pre_tokenizer": cuts normalized text into words for BPE and maps each
// word's bytes to the byte-level alphabet. Supported: the layout of Qwen2 / Qwen3 (and
// Llama 3): Sequence[Split(regex)..., ByteLevel], or a lone ByteLevel; Split with behavior
// Isolated or Removed and either `invert`; ByteLevel with add_prefix_space and use_regex false.
// Anything else is refused at load, naming the field.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json_field.h"
#include "pcre2_regex.h"

namespace omni::models {

class PreTokenizer {
 public:
  // `field` is the "pre_tokenizer" member; nullopt when absent or null (refused).
  PreTokenizer(const std::optional<JsonField>& field, const std::string& source);

  // Appends the words of well-formed UTF-8 `text`, in the byte-level alphabet.
  void split(std::string_view text, std::vector<std::string>* words) const;

 private:
  struct SplitStep {
    std::unique_ptr<Pcre2Regex> regex;
    bool invert = false;          // the gaps are the pieces the behavior acts on
    bool remove_matches = false;  // "Removed"; else "Isolated": matches and gaps both kept
  };
  void add_split(const JsonField& field);
  void check_byte_level(const JsonField& field) const;

  std::vector<SplitStep> steps_;
};

}  // namespace omni::models
