// The hand-offs between the stages of Qwen3-Omni, as plain functions over tensors and ids (no
// model objects), so that a multi-process pipeline can run them between its stages.
//
// thinker -> talker, as the reference's Qwen3OmniMoeForConditionalGeneration.generate builds it:
//   user part      every prompt position whose turn is a user turn (the token after the
//                  preceding <|im_start|> is user_token_id); system and earlier assistant turns
//                  are dropped. Multimodal positions (audio / image / video tokens) take the
//                  thinker's hidden_states[accept_hidden_layer] row (-> hidden_projection),
//                  the others its input embedding row (-> text_projection).
//   assistant part 9 positions from the last "<|im_start|> assistant": text side = the first 3
//                  rows from there, 4 x tts_pad, tts_bos, the 4th row (the first generated token
//                  with the real tokenizer); codec side = 3 zero rows + the codec embeddings of
//                  nothink, think_bos, think_eos, the speaker, pad, bos. Input ids: tts_pad.
//   trailing text  the rows after those 4 (the generated tokens but the first; the last
//                  generated token is never fed back, so it has no row), then tts_eos; the
//                  reference then moves the tts_eos marker to the thinker's first stop token
//                  (and pads after it), which this function reproduces exactly. After the
//                  trailing rows, each step adds tts_pad.
// talker -> code2wav: frames of num_code_groups codes; flattened codebook-major ([groups, T]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace omni::models::qwen3_omni {

// What the thinker stage produced for one request.
struct ThinkerHandoff {
  std::vector<int64_t> prompt_ids;  // L
  std::vector<int64_t> generated;   // G >= 2 tokens, the stop token included
  // Rows of hidden_states[0] (input embeddings) and hidden_states[accept_hidden_layer] for the
  // prompt and every generated token that was fed back: [L + G - 1, thinker hidden] each.
  at::Tensor embeds, hidden;
  // The thinker's embedding rows of tts_bos, tts_eos, tts_pad: [3, thinker hidden].
  at::Tensor tts_embeds;
};

struct HandoffIds {
  int64_t im_start = 151644;
  int64_t user = 872;
  int64_t assistant = 77091;
  int64_t tts_pad = 151671;
  std::vector<int64_t> multimodal;   // audio, image, video token ids
  std::vector<int64_t> thinker_eos;  // the thinker's stop tokens
  // Codec ids of the assistant part: nothink, think_bos, think_eos, speaker, pad, bos.
  std::vector<int64_t> codec_prefix;
};

// The talker's prefill in the thinker's space: the talker projects the rows.
struct TalkerPrompt {
  at::Tensor rows;                  // [Lt, thinker hidden]
  std::vector<uint8_t> multimodal;  // [Lt] 1: hidden_projection, 0: text_projection
  std::vector<int64_t> codec_ids;   // [Lt] codec embedding added to the projected row, -1: none
  std::vector<int64_t> input_ids;   // [Lt] talker_input_ids (3-D rope)
  at::Tensor trailing;              // [n, thinker hidden] text rows, one per talker step
  at::Tensor tts_pad;               // [thinker hidden] the row after the trailing ones
};

// Throws omni::Error when the prompt has no "<|im_start|> assistant" turn or no user position,
// when fewer than 2 tokens were generated (the reference's assistant part needs the first
// generated token), or when the row counts do not match the ids.
TalkerPrompt build_talker_prompt(const ThinkerHandoff& thinker, const HandoffIds& ids);

// The talker's prefill alone (rows, flags, codec ids, input ids, tts_pad; no trailing rows):
// it needs the hand-off only up to the first generated token's row and 2 generated tokens, so a
// streaming talker starts while the thinker still writes. `thinker` may be partial: the prompt,
// the tokens so far and their rows (n + g - 1). Throws as build_talker_prompt.
TalkerPrompt build_talker_prefill(const ThinkerHandoff& thinker, const HandoffIds& ids);

// The trailing text rows one at a time, from a hand-off that may still be growing: what entry j
// (the text row of talker step j) is, once it can be known.
class TrailingText {
 public:
  struct Entry {
    enum Kind { kUnknown, kRow, kEos, kPad, kEnd } kind = kUnknown;
    int64_t row = -1;  // kRow: the row of the hand-off's embeds
  };
  TrailingText(const ThinkerHandoff& thinker, const HandoffIds& ids);
  // `finished`: the thinker's answer is complete (all its tokens and rows are in `thinker`).
  // Before that, kUnknown until the entry cannot change any more. kEnd: past the last entry
  // (the talker adds tts_pad from there on).
  Entry entry(int64_t j, const ThinkerHandoff& thinker, bool finished) const;
  // build_talker_prefill has what it needs: 2 generated tokens and the assistant turn's first
  // 4 rows.
  bool prefill_ready(const ThinkerHandoff& thinker) const;
  // The entry's row in the thinker's space ([thinker hidden]).
  at::Tensor row_of(const Entry& entry, const ThinkerHandoff& thinker) const;

 private:
  HandoffIds ids_;
  int64_t assistant_start_;
};

// Frames (each num_code_groups codes, group 0 first) -> codes [groups, T] int64 (CPU).
at::Tensor frames_to_codes(const std::vector<std::vector<int64_t>>& frames, int64_t groups);

}  // namespace omni::models::qwen3_omni
