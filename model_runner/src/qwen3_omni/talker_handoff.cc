#include "model_runner/qwen3_omni/talker_handoff.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

namespace {

int64_t assistant_turn_start(const std::vector<int64_t>& prompt, const HandoffIds& ids) {
  int64_t start = -1;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    if (prompt[p] == ids.im_start && prompt[p + 1] == ids.assistant)
      start = static_cast<int64_t>(p);
  }
  OMNI_CHECK(start >= 0,
             "thinker -> talker hand-off: the prompt has no \"<|im_start|>assistant\" turn "
             "(tokens ",
             ids.im_start, " ", ids.assistant, ")");
  return start;
}

}  // namespace

TalkerPrompt build_talker_prefill(const ThinkerHandoff& t, const HandoffIds& ids) {
  const auto& prompt = t.prompt_ids;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t g = static_cast<int64_t>(t.generated.size());
  OMNI_CHECK(n >= 2, "thinker -> talker hand-off: the prompt has ", n, " tokens");
  OMNI_CHECK(g >= 2, "thinker -> talker hand-off: the thinker generated ", g,
             " token(s); speech needs at least 2 (the reference's assistant part reads the first "
             "generated token and drops the last)");
  OMNI_CHECK(
      t.embeds.defined() && t.hidden.defined() && t.embeds.dim() == 2 &&
          t.embeds.size(0) == n + g - 1 && t.hidden.sizes() == t.embeds.sizes(),
      "thinker -> talker hand-off: embeds and hidden must both be [prompt + generated - 1 = ",
      n + g - 1, ", hidden] rows, got ", t.embeds.sizes(), " and ", t.hidden.sizes());
  OMNI_CHECK(t.tts_embeds.defined() && t.tts_embeds.dim() == 2 && t.tts_embeds.size(0) == 3 &&
                 t.tts_embeds.size(1) == t.embeds.size(1),
             "thinker -> talker hand-off: tts_embeds must be [3 (bos, eos, pad), ",
             t.embeds.size(1), "]");
  OMNI_CHECK(ids.codec_prefix.size() == 6,
             "thinker -> talker hand-off: codec_prefix needs 6 ids (nothink, think_bos, "
             "think_eos, speaker, pad, bos), got ",
             ids.codec_prefix.size());
  const auto is_multimodal = [&](int64_t id) {
    return std::find(ids.multimodal.begin(), ids.multimodal.end(), id) != ids.multimodal.end();
  };

  // User part: a position's turn is named by the token after the <|im_start|> before it (or at
  // it); positions before any <|im_start|> read position 1, as the reference's clamp does.
  std::vector<int64_t> rows;
  TalkerPrompt out;
  int64_t previous_start = -1;
  for (int64_t p = 0; p < n; ++p) {
    if (prompt[p] == ids.im_start) previous_start = p;
    const int64_t role = prompt[std::min(std::max<int64_t>(previous_start, 0) + 1, n - 1)];
    if (role != ids.user) continue;
    rows.push_back(p);
    out.multimodal.push_back(is_multimodal(prompt[p]) ? 1 : 0);
    out.codec_ids.push_back(-1);
    out.input_ids.push_back(prompt[p]);
  }
  OMNI_CHECK(!rows.empty(), "thinker -> talker hand-off: the prompt has no user turn (token ",
             ids.user, " after <|im_start|>)");

  const int64_t assistant_start = assistant_turn_start(prompt, ids);
  const int64_t available = n + g - 1 - assistant_start;  // rows from the assistant turn on
  OMNI_CHECK(available >= 4, "thinker -> talker hand-off: ", available,
             " rows after the assistant turn starts, the talker needs 4");

  const auto device = t.embeds.device();
  const auto index = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).to(device);
  };
  const auto bos = t.tts_embeds[0], pad = t.tts_embeds[2];
  // Rows of the user part: the hidden state for multimodal positions, the embedding otherwise.
  const auto where = index(rows);
  const auto multimodal =
      at::tensor(std::vector<int64_t>(out.multimodal.begin(), out.multimodal.end()), at::kLong)
          .to(device)
          .to(at::kBool)
          .unsqueeze(1);
  const auto user_rows =
      at::where(multimodal, t.hidden.index_select(0, where), t.embeds.index_select(0, where));
  const auto head = t.embeds.narrow(0, assistant_start, 3);
  const auto first = t.embeds.narrow(0, assistant_start + 3, 1);
  out.rows = at::cat(
      {user_rows, head, pad.unsqueeze(0).expand({4, pad.size(0)}), bos.unsqueeze(0), first}, 0);
  for (int64_t i = 0; i < 9; ++i) {
    out.multimodal.push_back(0);
    out.codec_ids.push_back(i < 3 ? -1 : ids.codec_prefix[i - 3]);
    out.input_ids.push_back(ids.tts_pad);
  }

  out.tts_pad = pad.clone();
  return out;
}

TrailingText::TrailingText(const ThinkerHandoff& t, const HandoffIds& ids)
    : ids_(ids), assistant_start_(assistant_turn_start(t.prompt_ids, ids)) {}

TrailingText::Entry TrailingText::entry(int64_t j, const ThinkerHandoff& t, bool finished) const {
  const int64_t n = static_cast<int64_t>(t.prompt_ids.size());
  const int64_t g = static_cast<int64_t>(t.generated.size());
  const int64_t rows = t.embeds.defined() ? t.embeds.size(0) : 0;
  const auto is_stop = [&](int64_t token) {
    return std::find(ids_.thinker_eos.begin(), ids_.thinker_eos.end(), token) !=
           ids_.thinker_eos.end();
  };
  int64_t first_eos = g;  // the first stop token among the generated, g when none (yet)
  for (int64_t i = 0; i < g; ++i) {
    if (is_stop(t.generated[i])) {
      first_eos = i;
      break;
    }
  }
  Entry e;
  if (finished) {
    // The rows after the first 4 of the assistant turn, then tts_eos; then the reference's
    // marker move: entry j > the first stop index is padding, entry j == it is tts_eos.
    const int64_t length = n + g - 1 - assistant_start_ - 4 + 1;
    if (j >= length) {
      e.kind = Entry::kEnd;
    } else if (j > first_eos) {
      e.kind = Entry::kPad;
    } else if (j == first_eos || j == length - 1) {
      e.kind = Entry::kEos;
    } else {
      e.kind = Entry::kRow;
      e.row = assistant_start_ + 4 + j;
    }
    return e;
  }
  // While the answer streams: entry j is a row once the thinker has generated token j without a
  // stop token up to it (so the marker cannot fall on it) and the row exists.
  const int64_t row = assistant_start_ + 4 + j;
  if (j < first_eos && j < g && row < rows) {
    e.kind = Entry::kRow;
    e.row = row;
  }
  return e;
}

bool TrailingText::prefill_ready(const ThinkerHandoff& t) const {
  const int64_t rows = t.embeds.defined() ? t.embeds.size(0) : 0;
  return t.generated.size() >= 2 && rows >= assistant_start_ + 4;
}

at::Tensor TrailingText::row_of(const Entry& e, const ThinkerHandoff& t) const {
  switch (e.kind) {
    case Entry::kRow:
      return t.embeds[e.row];
    case Entry::kEos:
      return t.tts_embeds[1];
    case Entry::kPad:
      return t.tts_embeds[2];
    default:
      OMNI_THROW("TrailingText::row_of: entry has no row");
  }
}

TalkerPrompt build_talker_prompt(const ThinkerHandoff& t, const HandoffIds& ids) {
  TalkerPrompt out = build_talker_prefill(t, ids);
  const TrailingText text(t, ids);
  std::vector<at::Tensor> rows;
  for (int64_t j = 0;; ++j) {
    const auto e = text.entry(j, t, /*finished=*/true);
    if (e.kind == TrailingText::Entry::kEnd) break;
    rows.push_back(text.row_of(e, t));
  }
  out.trailing =
      rows.empty() ? at::empty({0, t.embeds.size(1)}, t.embeds.options()) : at::stack(rows, 0);
  return out;
}

at::Tensor frames_to_codes(const std::vector<std::vector<int64_t>>& frames, int64_t groups) {
  OMNI_CHECK(groups > 0, "frames_to_codes: groups must be > 0");
  auto codes = at::empty({groups, static_cast<int64_t>(frames.size())}, at::kLong);
  auto acc = codes.accessor<int64_t, 2>();
  for (size_t f = 0; f < frames.size(); ++f) {
    OMNI_CHECK(static_cast<int64_t>(frames[f].size()) == groups, "frame ", f, " has ",
               frames[f].size(), " codes, expected ", groups);
    for (int64_t q = 0; q < groups; ++q) acc[q][static_cast<int64_t>(f)] = frames[f][q];
  }
  return codes;
}

}  // namespace omni::models::qwen3_omni
