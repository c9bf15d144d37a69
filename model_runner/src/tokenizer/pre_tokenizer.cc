#include "pre_tokenizer.h"

#include "byte_level.h"
#include "oniguruma_pattern.h"

namespace omni::models {

PreTokenizer::PreTokenizer(const std::optional<JsonField>& field, const std::string& source) {
  if (!field) {
    JsonField(nlohmann::json::object(), source, "")
        .fail_missing("pre_tokenizer", " (a byte-level BPE needs the ByteLevel pre-tokenizer)");
  }
  const std::string type = field->get("type").string();
  if (type == "ByteLevel") {
    check_byte_level(*field);
    return;
  }
  if (type == "Metaspace") {
    metaspace_ = parse_metaspace(*field, false);
    return;
  }
  if (type == "Sequence") {
    const std::vector<JsonField> steps = field->get("pretokenizers").items();
    const auto type_of = [&](size_t i) { return steps[i].get("type").string(); };
    bool sentencepiece = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      sentencepiece |= type_of(i) == "WhitespaceSplit" || type_of(i) == "Metaspace";
    }
    if (sentencepiece) {
      if (steps.size() == 2 && type_of(0) == "WhitespaceSplit" && type_of(1) == "Metaspace") {
        metaspace_ = parse_metaspace(steps[1], true);
        return;
      }
      if (steps.size() == 1 && type_of(0) == "Metaspace") {
        metaspace_ = parse_metaspace(steps[0], false);
        return;
      }
      field->get("pretokenizers")
          .fail(
              "unsupported SentencePiece pre-tokenizer sequence (supported: [Metaspace], "
              "[WhitespaceSplit, Metaspace])");
    }
  }
  if (type != "Sequence") {
    field->get("type").fail("unsupported pre-tokenizer '" + type +
                            "' (supported: ByteLevel, Sequence[Split..., ByteLevel])");
  }
  const std::vector<JsonField> steps = field->get("pretokenizers").items();
  if (steps.empty()) field->get("pretokenizers").fail("is empty");
  for (size_t i = 0; i + 1 < steps.size(); ++i) add_split(steps[i]);
  const JsonField& last = steps.back();
  if (last.get("type").string() != "ByteLevel") {
    last.get("type").fail("the last pre-tokenizer must be ByteLevel, got '" +
                          last.get("type").string() + "'");
  }
  check_byte_level(last);
}

PreTokenizer::Metaspace PreTokenizer::parse_metaspace(const JsonField& field,
                                                      bool whitespace_split) {
  Metaspace m;
  m.whitespace_split = whitespace_split;
  m.replacement = field.get_string("replacement", "\u2581");
  if (m.replacement.empty()) field.get("replacement").fail("is empty");
  if (const auto scheme = field.find("prepend_scheme")) {
    const std::string value = scheme->string();
    if (value == "always") {
      m.prepend = Metaspace::Prepend::kAlways;
    } else if (value == "first") {
      m.prepend = Metaspace::Prepend::kFirst;
    } else if (value == "never") {
      m.prepend = Metaspace::Prepend::kNever;
    } else {
      scheme->fail("unsupported prepend_scheme '" + value + "' (supported: always, first, never)");
    }
  } else {
    m.prepend = field.get_bool("add_prefix_space", true) ? Metaspace::Prepend::kAlways
                                                         : Metaspace::Prepend::kNever;
  }
  m.split = field.get_bool("split", true);
  return m;
}

namespace {

// Rust's char::is_whitespace (Unicode White_Space), what WhitespaceSplit splits on.
size_t whitespace_length(std::string_view text, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const size_t left = text.size() - pos;
  if (b(0) == ' ' || (b(0) >= 0x09 && b(0) <= 0x0D)) return 1;
  if (left >= 2 && b(0) == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;
  if (left >= 3) {
    const uint32_t cp =
        (static_cast<uint32_t>(b(0)) << 16) | (static_cast<uint32_t>(b(1)) << 8) | b(2);
    if (cp == 0xE19A80 /* U+1680 */ || (cp >= 0xE28080 && cp <= 0xE2808A) /* U+2000-200A */ ||
        cp == 0xE280A8 || cp == 0xE280A9 || cp == 0xE280AF /* U+2028, 2029, 202F */ ||
        cp == 0xE2819F /* U+205F */ || cp == 0xE38080 /* U+3000 */) {
      return 3;
    }
  }
  return 0;
}

}  // namespace

void PreTokenizer::split_metaspace(std::string_view text, bool at_text_start,
                                   const WordFn& fn) const {
  const Metaspace& m = *metaspace_;
  std::string word;
  // One piece (`first`: it starts the input) into its words.
  const auto emit = [&](std::string_view piece, bool first) {
    word.clear();
    for (const char c : piece) {
      if (c == ' ') {
        word += m.replacement;
      } else {
        word += c;
      }
    }
    const bool starts_with_replacement = word.compare(0, m.replacement.size(), m.replacement) == 0;
    if (!starts_with_replacement && (m.prepend == Metaspace::Prepend::kAlways ||
                                     (m.prepend == Metaspace::Prepend::kFirst && first))) {
      word.insert(0, m.replacement);
    }
    if (!m.split) {
      fn(word);
      return;
    }
    // Split before every replacement, which stays with what follows (MergedWithNext).
    const std::string_view all(word);
    size_t begin = 0;
    size_t at = all.find(m.replacement, 1);
    while (at != std::string_view::npos) {
      if (at > begin) fn(all.substr(begin, at - begin));
      begin = at;
      at = all.find(m.replacement, at + m.replacement.size());
    }
    if (begin < all.size()) fn(all.substr(begin));
  };
  if (!m.whitespace_split) {
    if (!text.empty()) emit(text, at_text_start);
    return;
  }
  size_t start = std::string_view::npos;
  for (size_t pos = 0; pos < text.size();) {
    const size_t ws = whitespace_length(text, pos);
    if (ws > 0) {
      if (start != std::string_view::npos) {
        emit(text.substr(start, pos - start), at_text_start && start == 0);
      }
      start = std::string_view::npos;
      pos += ws;
    } else {
      if (start == std::string_view::npos) start = pos;
      ++pos;
    }
  }
  if (start != std::string_view::npos) emit(text.substr(start), at_text_start && start == 0);
}

void PreTokenizer::add_split(const JsonField& field) {
  const std::string type = field.get("type").string();
  if (type != "Split") {
    field.get("type").fail("unsupported pre-tokenizer '" + type +
                           "' before ByteLevel (supported: Split)");
  }
  SplitStep step;
  const JsonField pattern = field.get("pattern");
  if (const auto regex = pattern.find("Regex")) {
    const std::string what = regex->source() + ": field '" + regex->path() + "'";
    step.regex = std::make_unique<Pcre2Regex>(oniguruma_to_pcre2(regex->string(), what),
                                              Pcre2Regex::Syntax::kRegex,
                                              what + " (regex /" + regex->string() + "/)");
  } else if (const auto literal = pattern.find("String")) {
    if (literal->string().empty()) literal->fail("is empty");
    step.regex =
        std::make_unique<Pcre2Regex>(literal->string(), Pcre2Regex::Syntax::kLiteral,
                                     literal->source() + ": field '" + literal->path() + "'");
  } else {
    pattern.fail("must be {\"Regex\": ...} or {\"String\": ...}");
  }
  const std::string behavior = field.get("behavior").string();
  if (behavior == "Removed") {
    step.remove_matches = true;
  } else if (behavior != "Isolated") {
    field.get("behavior")
        .fail("unsupported split behavior '" + behavior + "' (supported: Isolated, Removed)");
  }
  step.invert = field.get_bool("invert", false);
  steps_.push_back(std::move(step));
}

void PreTokenizer::check_byte_level(const JsonField& field) const {
  // Hugging Face's defaults for both are true.
  for (const char* option : {"add_prefix_space", "use_regex"}) {
    if (field.get_bool(option, true)) {
      field.get(option).fail("ByteLevel with " + std::string(option) +
                             " true is not supported (Qwen's tokenizers set it false)");
    }
  }
}

bool PreTokenizer::keeps_every_byte() const {
  if (metaspace_) return !metaspace_->whitespace_split;
  for (const SplitStep& step : steps_) {
    if (step.remove_matches) return false;
  }
  return true;
}

void PreTokenizer::split(std::string_view text, bool at_text_start, const WordFn& fn) const {
  if (metaspace_) {
    split_metaspace(text, at_text_start, fn);
    return;
  }
  std::string word;
  split_from(0, text, &word, fn);
}

void PreTokenizer::split_from(size_t step_index, std::string_view piece, std::string* word,
                              const WordFn& fn) const {
  if (step_index == steps_.size()) {
    word->clear();
    byte_level::encode(piece, word);
    fn(*word);
    return;
  }
  // Depth first, each piece through the next step as soon as it is cut: the words come out in
  // the order step-by-step splitting gives them, without a list of pieces per step.
  const SplitStep& step = steps_[step_index];
  // Matches and the gaps between them, in order; each a piece unless removed or empty.
  const auto keep = [&](size_t begin, size_t end, bool is_match) {
    if (step.invert) is_match = !is_match;
    if (end > begin && !(is_match && step.remove_matches)) {
      split_from(step_index + 1, piece.substr(begin, end - begin), word, fn);
    }
  };
  size_t gap_start = 0;
  step.regex->for_each_match(piece, [&](size_t begin, size_t end) {
    keep(gap_start, begin, false);
    keep(begin, end, true);
    gap_start = end;
  });
  keep(gap_start, piece.size(), false);
}

}  // namespace omni::models
