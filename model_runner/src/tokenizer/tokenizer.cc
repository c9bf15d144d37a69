#include "model_runner/tokenizer/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../weights/similar_names.h"
#include "added_vocabulary.h"
#include "bpe_model.h"
#include "byte_level.h"
#include "cpu_offload/check.h"
#include "json_field.h"
#include "normalizer.h"
#include "pre_tokenizer.h"
#include "unigram_model.h"
#include "utf8.h"
#include "util/read_text_file.h"

namespace omni::models {
namespace {

using Json = nlohmann::json;

// The "model": BPE (byte-level, Qwen) or Unigram (SentencePiece, T5 / UMT5).
class Model {
 public:
  explicit Model(const JsonField& model) {
    const std::string type = model.get("type").string();
    if (type == "BPE") {
      bpe_ = std::make_unique<BpeModel>(model);
    } else if (type == "Unigram") {
      unigram_ = std::make_unique<UnigramModel>(model);
    } else {
      model.get("type").fail("unsupported model type '" + type +
                             "' (supported: BPE) [also supported: Unigram]");
    }
  }
  void tokenize(std::string_view word, std::vector<int32_t>* ids) const {
    if (bpe_) {
      bpe_->tokenize(word, ids);
    } else {
      unigram_->tokenize(word, ids);
    }
  }
  std::optional<int32_t> token_to_id(std::string_view token) const {
    return bpe_ ? bpe_->token_to_id(token) : unigram_->token_to_id(token);
  }
  const std::string* id_to_token(int32_t id) const {
    return bpe_ ? bpe_->id_to_token(id) : unigram_->id_to_token(id);
  }
  size_t size() const { return bpe_ ? bpe_->size() : unigram_->size(); }
  const BpeModel* bpe() const { return bpe_.get(); }

 private:
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<UnigramModel> unigram_;
};

// The decoder: ByteLevel with the ByteLevel pre-tokenizer, Metaspace with Metaspace.
struct Decoder {
  bool metaspace = false;
  std::string replacement;
  bool strip_first = true;  // prepend_scheme other than "never": the first token loses its ▁
};

Decoder parse_decoder(const JsonField& root, bool metaspace) {
  const auto decoder = root.find("decoder");
  if (!decoder) {
    root.fail_missing("decoder", metaspace ? " (Metaspace needs the Metaspace decoder)"
                                           : " (byte-level BPE needs the ByteLevel decoder)");
  }
  const std::string type = decoder->get("type").string();
  const std::string wanted = metaspace ? "Metaspace" : "ByteLevel";
  if (type != wanted) {
    decoder->get("type").fail("unsupported decoder '" + type + "' (supported: ByteLevel, or " +
                              "Metaspace with the Metaspace pre-tokenizer; this file needs " +
                              wanted + ")");
  }
  Decoder out;
  out.metaspace = metaspace;
  if (metaspace) {
    out.replacement = decoder->get_string("replacement", "\u2581");
    if (const auto scheme = decoder->find("prepend_scheme")) {
      out.strip_first = scheme->string() != "never";
    } else {
      out.strip_first = decoder->get_bool("add_prefix_space", true);
    }
  }
  return out;
}

// The post_processor's template for one sequence: ids before and after it. Absent, null or
// ByteLevel: none. TemplateProcessing: its "single" template. Anything else: `error` is set and
// encode_with_template() refuses (encode() never uses it).
struct Template {
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  std::string error;
};

Template parse_template(const JsonField& root) {
  Template out;
  const auto processor = root.find("post_processor");
  if (!processor) return out;
  const std::string type = processor->get("type").string();
  if (type == "ByteLevel") return out;
  if (type != "TemplateProcessing") {
    out.error = root.source() + ": field 'post_processor.type': unsupported post_processor '" +
                type + "' (supported: TemplateProcessing, ByteLevel)";
    return out;
  }
  const JsonField special = processor->get("special_tokens");
  bool seen_sequence = false;
  for (const JsonField& item : processor->get("single").items()) {
    if (const auto sequence = item.find("Sequence")) {
      if (seen_sequence) sequence->fail("a second sequence in the single template");
      if (sequence->get("id").string() != "A") sequence->get("id").fail("must be \"A\"");
      seen_sequence = true;
    } else if (const auto token = item.find("SpecialToken")) {
      const std::string name = token->get("id").string();
      const JsonField entry = special.get(name);
      for (const JsonField& id : entry.get("ids").items()) {
        (seen_sequence ? out.after : out.before).push_back(static_cast<int32_t>(id.integer()));
      }
    } else {
      item.fail("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) processor->get("single").fail("has no {\"Sequence\": {\"id\": \"A\"}}");
  return out;
}

}  // namespace

// The parsed pipeline. Members are built in declaration order, each from its part of the file.
class Tokenizer::Impl {
 public:
  // `root` is the whole file; its fields are only read while constructing.
  explicit Impl(const JsonField& root)
      : source_(root.source()),
        normalizer_(root.find("normalizer")),
        pre_tokenizer_(root.find("pre_tokenizer"), source_),
        model_(root.get("model")),
        added_(AddedVocabulary::parse(
            root.find("added_tokens"),
            [this](const std::string& content) { return normalizer_.normalize(content); })) {
    decoder_ = parse_decoder(root, pre_tokenizer_.is_metaspace());
    template_ = parse_template(root);
    check_added_ids(root.find("added_tokens"));
    vocab_size_ = model_.size();
    for (const AddedToken& token : added_.tokens()) {
      if (!model_.token_to_id(token.content)) ++vocab_size_;
    }
    set_token_bounds();
  }

  std::vector<int32_t> encode(const std::string& text, bool allow_special,
                              std::optional<size_t> max_tokens) const {
    // The length alone can refuse a text before a byte of it is read.
    if (max_tokens && text_bytes_per_token_ &&
        !may_fit(text.size(), *max_tokens, *text_bytes_per_token_)) {
      refuse(*max_tokens, 0);
    }
    const size_t invalid = utf8::find_invalid(text);
    if (invalid != std::string::npos) {
      OMNI_THROW(source_, ": encode: the text is not valid UTF-8 (byte ", invalid, " of ",
                 text.size(), ")");
    }
    std::vector<int32_t> ids;
    const auto add_token = [&](int32_t id) {
      ids.push_back(id);
      if (max_tokens && ids.size() > *max_tokens) refuse(*max_tokens, ids.size());
    };
    const auto add_word = [&](std::string_view word) {
      // Merging is the costly part (a word of megabytes takes seconds): a word too long for
      // the tokens left is refused unmerged. The count never passes the limit before this.
      if (max_tokens && word_chars_per_token_ &&
          !may_fit(utf8::count_chars(word), *max_tokens - ids.size(), *word_chars_per_token_)) {
        refuse(*max_tokens, ids.size());
      }
      model_.tokenize(word, &ids);
      if (max_tokens && ids.size() > *max_tokens) refuse(*max_tokens, ids.size());
    };
    bool at_text_start = true;
    added_.raw_matcher().split(text, allow_special, [&](const TextPiece& raw) {
      if (raw.token_id >= 0) {
        add_token(raw.token_id);
        at_text_start = false;
        return;
      }
      const std::string normalized = normalizer_.normalize(std::string(raw.text));
      added_.normalized_matcher().split(normalized, allow_special, [&](const TextPiece& piece) {
        if (piece.token_id >= 0) {
          add_token(piece.token_id);
        } else {
          pre_tokenizer_.split(piece.text, at_text_start, add_word);
        }
        at_text_start = false;
      });
    });
    return ids;
  }

  std::vector<int32_t> encode_with_template(const std::string& text,
                                            std::optional<size_t> max_length) const {
    if (!template_.error.empty()) OMNI_THROW(template_.error);
    std::vector<int32_t> ids = template_.before;
    std::vector<int32_t> body = encode(text, true, std::nullopt);
    if (max_length) {
      const size_t added = template_.before.size() + template_.after.size();
      if (*max_length < added) {
        OMNI_THROW(source_, ": max_length ", *max_length, " leaves no room for the ", added,
                   " special tokens of the template");
      }
      if (body.size() > *max_length - added) body.resize(*max_length - added);
    }
    ids.insert(ids.end(), body.begin(), body.end());
    ids.insert(ids.end(), template_.after.begin(), template_.after.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const {
    if (decoder_.metaspace) return decode_metaspace(ids, skip_special);
    std::string bytes;
    for (const int32_t id : ids) {
      const std::string* token = id_to_token(id);
      if (token == nullptr) continue;  // as Hugging Face: an id past the vocabulary is dropped
      if (skip_special && added_.is_special_content(*token)) continue;
      // A token with characters outside the byte-level alphabet stands for its own UTF-8.
      if (!byte_level::decode(*token, &bytes)) bytes += *token;
    }
    return utf8::to_valid_lossy(bytes);
  }

  std::string decode_metaspace(const std::vector<int32_t>& ids, bool skip_special) const {
    std::string out;
    bool first = true;
    for (const int32_t id : ids) {
      const std::string* token = id_to_token(id);
      if (token == nullptr) continue;
      if (skip_special && added_.is_special_content(*token)) continue;
      std::string text;
      for (size_t pos = 0; pos < token->size();) {
        if (token->compare(pos, decoder_.replacement.size(), decoder_.replacement) == 0) {
          text += ' ';
          pos += decoder_.replacement.size();
        } else {
          text += (*token)[pos++];
        }
      }
      if (first && decoder_.strip_first && !text.empty() && text[0] == ' ') text.erase(0, 1);
      first = false;
      out += text;
    }
    return out;
  }

  std::optional<int32_t> find_token(const std::string& token) const {
    if (const AddedToken* added = added_.find(token)) return added->id;
    return model_.token_to_id(token);
  }

  const std::string* id_to_token(int32_t id) const {
    if (const AddedToken* added = added_.find(id)) return &added->content;
    return model_.id_to_token(id);
  }

  std::vector<std::string> added_contents() const {
    std::vector<std::string> out;
    for (const AddedToken& token : added_.tokens()) out.push_back(token.content);
    return out;
  }

  bool is_special(int32_t id) const {
    const AddedToken* added = added_.find(id);
    return added != nullptr && added->special;
  }

  size_t vocab_size() const { return vocab_size_; }
  const std::string& source() const { return source_; }

  std::optional<size_t> max_text_bytes(size_t max_tokens) const {
    if (!text_bytes_per_token_) return std::nullopt;
    const size_t per = *text_bytes_per_token_;
    return max_tokens > SIZE_MAX / per ? SIZE_MAX : max_tokens * per;
  }

 private:
  // Whether `bytes` can make at most `tokens` tokens of at most `per_token` bytes each.
  static bool may_fit(size_t bytes, size_t tokens, size_t per_token) {
    return bytes / per_token + (bytes % per_token != 0 ? 1 : 0) <= tokens;
  }

  [[noreturn]] void refuse(size_t max_tokens, size_t encoded) const {
    throw TokenLimitError(
        source_ + ": the text needs more than " + std::to_string(max_tokens) + " tokens",
        max_tokens, encoded);
  }

  // The bounds a limited encode() refuses by. They hold for byte-level BPE with every byte in
  // the vocabulary: each byte of a word is in exactly one of its tokens, so a word of n
  // characters (one per byte) makes at least n / longest tokens. Then the text: each normalized
  // byte is in a word or an added token, and the normalizer shortens by at most max_shrink.
  void set_token_bounds() {
    const BpeModel* bpe = model_.bpe();
    if (bpe == nullptr || pre_tokenizer_.is_metaspace()) return;  // unknown characters fuse
    for (int b = 0; b < 256; ++b) {
      std::string stand_in;
      byte_level::encode(std::string(1, static_cast<char>(b)), &stand_in);
      if (!bpe->token_to_id(stand_in)) return;  // a byte that is dropped or fused
    }
    word_chars_per_token_ = std::max<size_t>(1, bpe->max_token_chars());
    const auto shrink = normalizer_.max_shrink();
    if (!shrink || !pre_tokenizer_.keeps_every_byte()) return;
    size_t longest = *word_chars_per_token_;
    for (const AddedToken& token : added_.tokens()) {
      longest =
          std::max({longest, token.content.size(), normalizer_.normalize(token.content).size()});
    }
    text_bytes_per_token_ = longest * *shrink;
  }

  // An added token that is also in the BPE vocabulary must have its id there, and one that is
  // not must not take the id of another token: Hugging Face would renumber it (and only warn).
  void check_added_ids(const std::optional<JsonField>& added_tokens) const {
    if (!added_tokens) return;
    for (const JsonField& field : added_tokens->items()) {
      const std::string content = field.get("content").string();
      const int32_t id = static_cast<int32_t>(field.get("id").integer());
      if (const auto vocab_id = model_.token_to_id(content)) {
        if (*vocab_id != id) {
          field.get("id").fail("'" + content + "' has id " + std::to_string(*vocab_id) +
                               " in model.vocab");
        }
      } else if (const std::string* other = model_.id_to_token(id)) {
        field.get("id").fail("id " + std::to_string(id) + " of '" + content + "' belongs to '" +
                             *other + "' in model.vocab");
      }
    }
  }

  std::string source_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Model model_;
  AddedVocabulary added_;
  Decoder decoder_;
  Template template_;
  size_t vocab_size_ = 0;
  // The most characters of a pre-tokenized word one token covers, and the most bytes of the
  // raw text; unset where no such bound holds (see set_token_bounds).
  std::optional<size_t> word_chars_per_token_;
  std::optional<size_t> text_bytes_per_token_;
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

std::optional<size_t> Tokenizer::max_text_bytes(size_t max_tokens) const {
  return impl_->max_text_bytes(max_tokens);
}

Tokenizer Tokenizer::load(const std::string& path_or_dir) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path_or_dir, ec)
                               ? (std::filesystem::path(path_or_dir) / "tokenizer.json").string()
                               : path_or_dir;
  return parse(read_text_file(file, "tokenizer"), file);
}

Tokenizer Tokenizer::parse(const std::string& text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& e) {
    OMNI_THROW(source, ": invalid JSON at byte ", e.byte, ": ", e.what());
  }
  if (!root.is_object()) {
    OMNI_THROW(source, ": the top level must be an object, got ", root.type_name());
  }
  return Tokenizer(std::make_shared<const Impl>(JsonField(root, source, "")));
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool allow_special,
                                       std::optional<size_t> max_tokens) const {
  return impl_->encode(text, allow_special, max_tokens);
}

std::vector<int32_t> Tokenizer::encode_with_template(const std::string& text) const {
  return impl_->encode_with_template(text, std::nullopt);
}

Tokenizer::Padded Tokenizer::encode_padded(const std::string& text, size_t max_length,
                                           int32_t pad_id) const {
  Padded out;
  out.ids = impl_->encode_with_template(text, max_length);
  out.attention_mask.assign(out.ids.size(), 1);
  out.ids.resize(max_length, pad_id);
  out.attention_mask.resize(max_length, 0);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

int32_t Tokenizer::token_id(const std::string& token) const {
  if (const auto id = impl_->find_token(token)) return *id;
  OMNI_THROW(impl_->source(), ": unknown token '", token, "'",
             detail::similar_names_suffix(token, impl_->added_contents()));
}

std::optional<int32_t> Tokenizer::find_token(const std::string& token) const {
  return impl_->find_token(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->id_to_token(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }

size_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }

const std::string& Tokenizer::source() const { return impl_->source(); }

}  // namespace omni::models
