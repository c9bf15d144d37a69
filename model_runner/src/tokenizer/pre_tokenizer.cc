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

void PreTokenizer::split(std::string_view text, std::vector<std::string>* words) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const SplitStep& step : steps_) {
    next.clear();
    for (const std::string_view piece : pieces) {
      // Matches and the gaps between them, in order; each a piece unless removed or empty.
      const auto keep = [&](size_t begin, size_t end, bool is_match) {
        if (step.invert) is_match = !is_match;
        if (end > begin && !(is_match && step.remove_matches)) {
          next.push_back(piece.substr(begin, end - begin));
        }
      };
      size_t gap_start = 0;
      for (const auto& [begin, end] : step.regex->find_all(piece)) {
        keep(gap_start, begin, false);
        keep(begin, end, true);
        gap_start = end;
      }
      keep(gap_start, piece.size(), false);
    }
    pieces.swap(next);
  }
  for (const std::string_view piece : pieces) {
    std::string word;
    byte_level::encode(piece, &word);
    words->push_back(std::move(word));
  }
}

}  // namespace omni::models
