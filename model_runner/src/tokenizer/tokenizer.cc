#include "model_runner/tokenizer/tokenizer.h"

#include <cerrno>
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
#include "utf8.h"
#include "util/read_text_file.h"

namespace omni::models {
namespace {

using Json = nlohmann::json;

const JsonField& check_model_type(const JsonField& model) {
  const std::string type = model.get("type").string();
  if (type != "BPE") {
    model.get("type").fail("unsupported model type '" + type + "' (supported: BPE)");
  }
  return model;
}

void check_decoder(const JsonField& root) {
  const auto decoder = root.find("decoder");
  if (!decoder) root.fail_missing("decoder", " (byte-level BPE needs the ByteLevel decoder)");
  const std::string type = decoder->get("type").string();
  if (type != "ByteLevel") {
    decoder->get("type").fail("unsupported decoder '" + type + "' (supported: ByteLevel)");
  }
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
        model_(check_model_type(root.get("model"))),
        added_(AddedVocabulary::parse(
            root.find("added_tokens"),
            [this](const std::string& content) { return normalizer_.normalize(content); })) {
    check_decoder(root);
    check_added_ids(root.find("added_tokens"));
    vocab_size_ = model_.size();
    for (const AddedToken& token : added_.tokens()) {
      if (!model_.token_to_id(token.content)) ++vocab_size_;
    }
  }

  std::vector<int32_t> encode(const std::string& text, bool allow_special) const {
    const size_t invalid = utf8::find_invalid(text);
    if (invalid != std::string::npos) {
      OMNI_THROW(source_, ": encode: the text is not valid UTF-8 (byte ", invalid, " of ",
                 text.size(), ")");
    }
    std::vector<int32_t> ids;
    std::vector<TextPiece> raw_pieces;
    added_.raw_matcher().split(text, allow_special, &raw_pieces);
    std::vector<TextPiece> pieces;
    std::vector<std::string> words;
    for (const TextPiece& raw : raw_pieces) {
      if (raw.token_id >= 0) {
        ids.push_back(raw.token_id);
        continue;
      }
      const std::string normalized = normalizer_.normalize(std::string(raw.text));
      pieces.clear();
      added_.normalized_matcher().split(normalized, allow_special, &pieces);
      for (const TextPiece& piece : pieces) {
        if (piece.token_id >= 0) {
          ids.push_back(piece.token_id);
          continue;
        }
        words.clear();
        pre_tokenizer_.split(piece.text, &words);
        for (const std::string& word : words) model_.tokenize(word, &ids);
      }
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const {
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

 private:
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
  BpeModel model_;
  AddedVocabulary added_;
  size_t vocab_size_ = 0;
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

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

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool allow_special) const {
  return impl_->encode(text, allow_special);
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
