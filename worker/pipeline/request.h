// A request to a pipeline, whatever family runs it: the conversation, the outputs asked for,
// and each family's own parameters (its sampling of each stage, a denoiser's size and steps)
// as a part of their own type, which only that family's kinds read.
#pragma once

#include <string>
#include <vector>

#include "model_runner/runner/conversation.h"
#include "worker/pipeline/family_parts.h"

namespace omni::pipeline {

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
  // The families' own parameters, by type (FamilyParts::get<T>).
  FamilyParts parts;
};

}  // namespace omni::pipeline
