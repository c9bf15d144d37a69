// A request to a pipeline, whatever family runs it: the conversation, the outputs asked for,
// and each family's own parameters (its sampling of each stage, a denoiser's size and steps)
// as a part of their own type, which only that family's kinds read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model_runner/runner/conversation.h"
#include "worker/pipeline/family_parts.h"

namespace omni::pipeline {

// The caller's sampling of the answer (OpenAI's request fields), whatever the family; an unset
// field keeps the family's and the stage config's defaults. The family maps them onto its
// stages: the text's onto the stage that writes the text, `seed` onto every stage that samples,
// `max_audio_frames` onto the one that speaks.
struct AnswerSampling {
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k, max_tokens, max_audio_frames;
  std::optional<uint64_t> seed;
};

struct Request {
  models::ChatRequest chat;
  bool text_output = true;   // modalities: text
  bool audio_output = true;  // modalities: audio (a pipeline with a stage that answers audio)
  // A voice the pipeline lists (Pipeline::voices), any case; empty: its default.
  std::string voice;
  // The text stops when it contains one of these (OpenAI's `stop`); it ends before it, and the
  // audio speaks what came before.
  std::vector<std::string> stop_strings;
  // Decode audio chunks while the answer is spoken (for on_audio and time to first audio).
  bool stream_audio = true;
  // Decode the result's whole waveform at the end. A caller that only sends the streamed chunks
  // (serve's streamed answers) turns it off: it would decode every frame a second time.
  bool waveform = true;
  // Wins over the families' parts and the stage config's defaults.
  AnswerSampling sampling;
  // The families' own parameters, by type (FamilyParts::get<T>).
  FamilyParts parts;
};

}  // namespace omni::pipeline
