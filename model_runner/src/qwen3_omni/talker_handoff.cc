#include "model_runner/qwen3_omni/talker_handoff.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

TalkerPrompt build_talker_prompt(const ThinkerHandoff& t, const HandoffIds& ids) {
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

  int64_t assistant_start = -1;
  for (int64_t p = 0; p + 1 < n; ++p) {
    if (prompt[p] == ids.im_start && prompt[p + 1] == ids.assistant) assistant_start = p;
  }
  OMNI_CHECK(assistant_start >= 0,
             "thinker -> talker hand-off: the prompt has no \"<|im_start|>assistant\" turn "
             "(tokens ",
             ids.im_start, " ", ids.assistant, ")");
  const int64_t available = n + g - 1 - assistant_start;  // rows from the assistant turn on
  OMNI_CHECK(available >= 4, "thinker -> talker hand-off: ", available,
             " rows after the assistant turn starts, the talker needs 4");

  const auto device = t.embeds.device();
  const auto index = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).to(device);
  };
  const auto bos = t.tts_embeds[0], eos = t.tts_embeds[1], pad = t.tts_embeds[2];
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

  // Trailing text: rows after the first 4 of the assistant turn, then tts_eos; then the
  // reference's marker move: entry j > first stop index is padding, entry j == it is tts_eos.
  auto trailing =
      at::cat({t.embeds.narrow(0, assistant_start + 4, available - 4), eos.unsqueeze(0)}, 0);
  int64_t first_eos = g;
  for (int64_t i = 0; i < g; ++i) {
    if (std::find(ids.thinker_eos.begin(), ids.thinker_eos.end(), t.generated[i]) !=
        ids.thinker_eos.end()) {
      first_eos = i;
      break;
    }
  }
  for (int64_t j = first_eos; j < trailing.size(0); ++j) {
    trailing[j].copy_(j == first_eos ? eos : pad);
  }
  out.trailing = trailing;
  out.tts_pad = pad.clone();
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
