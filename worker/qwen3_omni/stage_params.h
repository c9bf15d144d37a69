// What each Qwen3-Omni stage kind reads of a request (StageCall::params): the family cuts a
// request (its chat and its models::OmniOptions part) into one of these per stage and hands it to
// the stage as it is; only the gRPC layer turns it into JSON (not protobuf, so that a new field
// needs no wire change) and the worker's stage reads it back (params_as). The media travel as bytes
// in StageCall::media.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/qwen3_omni/omni_options.h"
#include "model_runner/runner/conversation.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

struct ThinkerParams : StageParams {
  std::string text;
  std::string system_prompt;
  std::vector<models::ChatTurn> history;  // earlier turns (their media come first in the call's)
  std::vector<models::ChatPart> parts;    // the turn to answer in order; empty: media, then text
  models::SamplingParams sampling = models::OmniSampling::default_thinker();
  // Send the hand-off rows (embeddings, hidden states) downstream: the talker runs.
  bool handoff = false;
  // The answer ends when its text contains one of these (not included; finish reason stop).
  std::vector<std::string> stop;

  std::string to_json() const override;
};

struct TalkerParams : StageParams {
  std::string speaker;
  models::SamplingParams talker = models::OmniSampling::default_talker();
  models::SamplingParams code_predictor = models::OmniSampling::default_code_predictor();
  int64_t max_frames = 4096;

  std::string to_json() const override;
};

struct Code2WavParams : StageParams {
  bool stream_audio = true;  // decode chunks as frames arrive (audio packets)
  models::qwen3_omni::Code2WavStreamOptions stream;
  // At the end, the reference's decode of all frames (chunks of 300, 25 of context) as the
  // tensor "waveform": what Hugging Face's generate returns and the CLI writes.
  bool waveform = true;

  std::string to_json() const override;
};

// What the talker's info says beyond the core's fields (StageInfo::family_json): the codes in a
// frame, for the answer's codes tensor when no frame came.
struct TalkerFacts {
  int64_t num_code_groups = 16;
};
std::string talker_facts_json(const TalkerFacts& facts);
TalkerFacts talker_facts(const std::string& json);  // "": the defaults

// The JSON forms' readers. Throw StageError kInvalidArgument naming the field.
ThinkerParams thinker_params(const std::string& json);
TalkerParams talker_params(const std::string& json);
Code2WavParams code2wav_params(const std::string& json);

}  // namespace omni::pipeline
