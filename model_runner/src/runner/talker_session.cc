// TalkerRunner::Session: one request's talker over a hand-off that streams in.
#include <ATen/ATen.h>

#include "cpu_offload/logging.h"
#include "model_runner/runner/speech_runners.h"

namespace omni::models {

std::unique_ptr<TalkerRunner::Session> TalkerRunner::start_session(const Request& request) {
  return std::unique_ptr<Session>(new Session(*this, request));
}

TalkerRunner::Session::Session(TalkerRunner& runner, Request request)
    : runner_(runner), request_(std::move(request)) {}

TalkerRunner::Session::Next TalkerRunner::Session::end_without_frames(const char* reason) {
  none_reason_ = reason;
  return Next::kDone;
}

TalkerRunner::Session::Next TalkerRunner::Session::advance() {
  using Kind = qwen3_omni::TrailingText::Entry::Kind;
  if (!none_reason_.empty() || (decode_ && decode_->done())) return Next::kDone;
  auto& talker = *runner_.talker_;
  if (!decode_) {
    const bool cancelled = h.finished && h.finish_reason == "cancelled";
    // The prompt and the thinker's stop tokens come with its first packet.
    if (h.handoff.prompt_ids.empty()) {
      if (!h.finished) return Next::kInput;
      return end_without_frames(cancelled ? "cancelled" : "none");
    }
    if (!text_) {
      const std::string name =
          request_.speaker.empty() ? runner_.default_speaker() : request_.speaker;
      const int64_t speaker = qwen3_omni::speaker_codec_id(runner_.cfg_, name);
      ids_ = qwen3_omni::handoff_ids(runner_.thinker_cfg_, runner_.cfg_, runner_.ids_, speaker,
                                     h.thinker_stop_tokens);
      text_.emplace(h.handoff, *ids_);
    }
    // The prefill needs the assistant turn's first 4 rows and a second generated token (the
    // reference reads the first and drops the last).
    if (!h.finished && !text_->prefill_ready(h.handoff)) return Next::kInput;
    if (cancelled) return end_without_frames("cancelled");
    if (h.handoff.generated.size() < 2) {
      log_warning("the thinker generated ", h.handoff.generated.size(),
                  " token(s): too little text to speak, no audio");
      return end_without_frames("none");
    }
    const auto prompt = qwen3_omni::build_talker_prefill(h.handoff, *ids_);
    state_.emplace(talker.new_state());
    if (before_prefill && !before_prefill(*state_, static_cast<int64_t>(prompt.input_ids.size()))) {
      state_.reset();
      return Next::kInput;
    }
    decode_.emplace(runner_.cfg_, request_.talker, request_.code_predictor, request_.max_frames);
    decode_->start(talker.prefill(prompt, h.image_grids, *state_));
    state_->trailing_complete = false;
    if (decode_->done()) return Next::kDone;
  }
  // The next step's text row, once the thinker has written it.
  auto& state = *state_;
  while (!state.trailing_complete && static_cast<int64_t>(state.trailing.size()) <= state.step) {
    const auto e = text_->entry(next_, h.handoff, h.finished);
    if (e.kind == Kind::kUnknown) return Next::kInput;
    if (e.kind == Kind::kEnd) {
      talker.add_trailing(at::empty({0, runner_.cfg_.thinker_hidden_size}), true, state);
      break;
    }
    talker.add_trailing(text_->row_of(e, h.handoff).unsqueeze(0), false, state);
    ++next_;
  }
  return Next::kStep;
}

qwen3_omni::TalkerRun TalkerRunner::Session::run() const {
  if (!decode_) {
    qwen3_omni::TalkerRun none;
    none.finish_reason = none_reason_.empty() ? "none" : none_reason_;
    return none;
  }
  auto run = decode_->run();
  run.code_predictor_ms = state_->code_predictor_ms;
  return run;
}

}  // namespace omni::models
