// The tokenizer.json "pre_tokenizer": cuts normalized text into words for BPE and maps each
// word's bytes to the byte-level alphabet. Supported: the layout of Qwen2 / Qwen3 (and
// Llama 3): Sequence[Split(regex)..., ByteLevel], or a lone ByteLevel; Split with behavior
// Isolated or Removed and either `invert`; ByteLevel with add_prefix_space and use_regex false.
// For SentencePiece (T5 / UMT5) tokenizers: Metaspace (prepend_scheme always, first or never, or
// the older add_prefix_space; split true or false), alone or after WhitespaceSplit in a
// Sequence; its words stay UTF-8. Anything else is refused at load, naming the field.
#pragma once

#include <functional>
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

  // A SentencePiece Metaspace pre-tokenizer (else byte-level).
  bool is_metaspace() const { return metaspace_.has_value(); }

  // Whether every byte of the text ends up in some word: no Split removes its matches and no
  // WhitespaceSplit drops whitespace.
  bool keeps_every_byte() const;

  // A word, valid only during the call.
  using WordFn = std::function<void(std::string_view word)>;
  // Hands the words of well-formed UTF-8 `text` to `fn` in order, one at a time as they are
  // found (a long text never has all its words at once), in the byte-level alphabet (ByteLevel)
  // or with spaces as the Metaspace replacement. `at_text_start`: `text` begins the input (for
  // Metaspace's prepend_scheme "first"). An exception from `fn` stops the split.
  void split(std::string_view text, bool at_text_start, const WordFn& fn) const;

 private:
  struct SplitStep {
    std::unique_ptr<Pcre2Regex> regex;
    bool invert = false;          // the gaps are the pieces the behavior acts on
    bool remove_matches = false;  // "Removed"; else "Isolated": matches and gaps both kept
  };
  struct Metaspace {
    enum class Prepend { kAlways, kFirst, kNever };
    bool whitespace_split = false;  // a WhitespaceSplit runs first
    Prepend prepend = Prepend::kAlways;
    bool split = true;
    std::string replacement;
  };
  static Metaspace parse_metaspace(const JsonField& field, bool whitespace_split);
  void split_metaspace(std::string_view text, bool at_text_start, const WordFn& fn) const;
  // The pieces of `piece` after steps_[step_index...], as words in the byte-level alphabet (built
  // in `word`, reused from one to the next).
  void split_from(size_t step_index, std::string_view piece, std::string* word,
                  const WordFn& fn) const;
  void add_split(const JsonField& field);
  void check_byte_level(const JsonField& field) const;

  std::vector<SplitStep> steps_;
  std::optional<Metaspace> metaspace_;  // set: a SentencePiece pre-tokenizer, steps_ unused
};

}  // namespace omni::models
