// A Hugging Face `tokenizer.json` tokenizer: the byte-level BPE of GPT-2 / Qwen2 / Qwen2.5-Omni /
// Qwen3-Omni (and the SentencePiece Unigram of T5 / UMT5, see below), encoding and decoding exactly
// like the `tokenizers` library (the tests hold it to encodings that library produced).
//
// encode(): added tokens (`<|im_start|>`, ...) are matched first in the raw text, longest match
// first; the text between them is normalized (NFC), matched against the added tokens marked
// "normalized", split by the pre-tokenizer regex, mapped byte by byte to GPT-2's printable
// alphabet and merged by BPE rank. This is Hugging Face's `encode(text,
// add_special_tokens=False)`: no post-processor template (BOS/EOS) is applied.
//
// Where Hugging Face's libraries and ours differ, ours are made to agree: the regex runs on
// PCRE2, rewritten from Oniguruma's Ruby syntax and given Oniguruma's newer Unicode classes
// (oniguruma_pattern.h); NFC uses Hugging Face's Unicode 9.0 tables, so marks assigned since
// are left alone as it leaves them (unicode_nfc.h). Text that is already NFC is not changed.
//
// decode(): ids back to token strings, the byte-level alphabet back to bytes, bytes that are not
// UTF-8 replaced by U+FFFD (per maximal invalid sequence, as Rust's from_utf8_lossy). Like
// Hugging Face, ids that name no token are skipped, and added tokens pass through the
// byte-level decoder too (verbatim for ASCII ones like all of Qwen's).
//
// Supported tokenizer.json: model BPE (merges as "a b" strings or ["a", "b"] pairs;
// `ignore_merges`; `unk_token` with `fuse_unk`); normalizer null, NFC or a Sequence of those;
// pre_tokenizer ByteLevel or Sequence[Split(Regex|String, any `invert`, behavior Isolated or
// Removed)..., ByteLevel], ByteLevel with add_prefix_space and use_regex false; decoder
// ByteLevel; added tokens without lstrip/rstrip/single_word. Everything else is refused at
// load() with the file, the field and what is supported, never silently encoded differently.
// post_processor, truncation and padding are not used by encode().
//
// SentencePiece Unigram tokenizers (T5TokenizerFast: T5, UMT5 as Wan2.x's text encoder uses)
// are supported too: model Unigram (Viterbi over the piece scores, unk_id, byte_fallback);
// normalizer Precompiled (the sentencepiece charsmap, applied per grapheme cluster as Hugging
// Face does; see precompiled_charsmap.h for the cluster approximation), with Strip and Replace
// (as transformers' SpmConverter adds them) in a Sequence; pre_tokenizer
// Metaspace, alone or after WhitespaceSplit; decoder Metaspace; and, for
// encode_with_template() / encode_padded(), the TemplateProcessing post-processor (T5's
// "$A </s>").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models {

// What encode() throws when the text needs more than its `max_tokens`. An omni::Error, so a
// serving stage answers it as the client's mistake (invalid argument), not its own.
class TokenLimitError : public omni::Error {
 public:
  TokenLimitError(const std::string& message, size_t max_tokens, size_t encoded)
      : omni::Error(message), max_tokens_(max_tokens), encoded_(encoded) {}
  size_t max_tokens() const { return max_tokens_; }
  // The tokens encoded when it gave up: 0 when the text's length alone refused it.
  size_t encoded() const { return encoded_; }

 private:
  size_t max_tokens_;
  size_t encoded_;
};

class Tokenizer {
 public:
  // `path_or_dir` is a tokenizer.json file or a directory holding one (a checkpoint).
  static Tokenizer load(const std::string& path_or_dir);
  // Parses tokenizer.json `text`; `source` names it in errors (a path, "inline tokenizer").
  static Tokenizer parse(const std::string& text, const std::string& source);

  // `text` must be UTF-8 (else omni::Error naming the byte). With `allow_special` false the special
  // added tokens are not matched and `<|im_start|>` typed by a user encodes as plain text (Hugging
  // Face's `split_special_tokens`); non-special added tokens (e.g. `<tool_call>`) still match.
  //
  // With `max_tokens`, a text that needs more tokens throws TokenLimitError as soon as that is
  // certain, so that an untrusted text costs about what max_tokens tokens cost, whatever its
  // length: at once when it has more bytes than max_tokens of the longest tokens could cover
  // (allowing for what the normalizer shortens), before merging a word too long for the tokens
  // left, and at the first word past the limit. Words reach the model one at a time, never all
  // held. A text that fits gets the ids it gets without a limit. Where text can vanish or fuse
  // (SentencePiece: Strip, WhitespaceSplit, unknown characters fused) only the count applies.
  // Thread-safe.
  std::vector<int32_t> encode(const std::string& text, bool allow_special = true,
                              std::optional<size_t> max_tokens = std::nullopt) const;
  // The most bytes of text that could encode to at most `max_tokens` tokens (the bound a
  // limited encode() refuses by at once), or nullopt where no such bound holds. A server checks
  // an untrusted text against it before parsing its request.
  std::optional<size_t> max_text_bytes(size_t max_tokens) const;
  // encode() wrapped in the post-processor's single-sequence template: Hugging Face's
  // `tokenizer(text).input_ids` (add_special_tokens=True), e.g. T5's ids then </s>. Throws when
  // the post_processor is not TemplateProcessing, ByteLevel or absent. Thread-safe.
  std::vector<int32_t> encode_with_template(const std::string& text) const;

  // What diffusers' Wan / UMT5 pipelines ask of the tokenizer: `tokenizer(text,
  // padding="max_length", max_length=max_length, truncation=True, add_special_tokens=True,
  // return_attention_mask=True)`. The text's ids are cut to leave room for the template's
  // special tokens, then the template is applied, then `pad_id` (T5: <pad> = 0) fills up to
  // max_length with mask 0. Thread-safe.
  struct Padded {
    std::vector<int32_t> ids;
    std::vector<int32_t> attention_mask;
  };
  Padded encode_padded(const std::string& text, size_t max_length, int32_t pad_id) const;

  // With `skip_special`, special added tokens are dropped. Thread-safe.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // The id of a token string as written in tokenizer.json (added tokens first, then the BPE
  // vocabulary: "<|im_end|>", or "Ġthe" for " the"). token_id throws naming the token and
  // the closest added tokens.
  int32_t token_id(const std::string& token) const;
  std::optional<int32_t> find_token(const std::string& token) const;
  // The token string of `id` (byte-level alphabet, not decoded), or nullopt.
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  // Distinct ids: the BPE vocabulary plus the added tokens outside it (Hugging Face's
  // get_vocab_size(with_added_tokens=True)). Qwen's models have more embedding rows than this.
  size_t vocab_size() const;
  // The file (or `source`) it was loaded from.
  const std::string& source() const;

 private:
  class Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);

  // Immutable after load (the BPE word cache inside is synchronized), so copies share it.
  std::shared_ptr<const Impl> impl_;
};

}  // namespace omni::models
