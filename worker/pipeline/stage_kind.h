// What the orchestrator knows of a kind of stage (a stage config's model_stage): which kinds it
// reads, whether a request runs it, its parameters for a request, what its packets add to the
// answer, and how this process runs one. The orchestrator (pipeline.cc) names no kind: each model
// family registers its own (model_family.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/request.h"
#include "worker/pipeline/stage.h"

namespace omni::pipeline {

struct PipelineCallbacks;
struct PipelineResult;

// What a kind's collect and finish see of the request and its answer.
struct StageAnswer {
  StageAnswer(const Request& r, const PipelineCallbacks& c, PipelineResult& out, std::string name,
              bool first)
      : request(r), callbacks(c), result(out), stage(std::move(name)), primary(first) {}

  const Request& request;
  const PipelineCallbacks& callbacks;
  PipelineResult& result;
  std::string stage;  // the stage's name, "stage 2 (<its kind>)"
  // The first stage of its kind in the graph answers the request; another of the same kind (on
  // a second branch) keeps its output under result.branch_outputs[stage].
  bool primary = true;
  double now_ms = 0;  // collect: since the request started
  // finish: the stage's metrics (its last packet's, first_packet_ms, done_ms) and its info.
  const std::map<std::string, double>* metrics = nullptr;
  std::function<StageInfo()> info;

  double metric(const std::string& key) const;  // 0 when absent
};

struct StageKind {
  std::string name;
  // The kinds a stage of this kind reads from; empty: an entry stage, which reads the request
  // (its text and media) and no other stage.
  std::vector<std::string> reads;
  // Runs only when the request asks for audio (and its sources run).
  bool speech = false;
  // Its stages answer with audio: a pipeline that has one can speak.
  bool answers_audio = false;
  // Its stages answer with video frames (PipelineResult::video).
  bool answers_video = false;
  // Its stages answer with still images (PipelineResult::images).
  bool answers_images = false;
  // Its info lists voices and a default voice.
  bool has_voices = false;
  // The stage's parameters for `request` (StageCall::params); `speak`: audio was asked for.
  std::function<std::shared_ptr<const StageParams>(const Request& request, bool speak)> params;
  // Adds one packet of the stage to the answer; false: a callback cancelled the request.
  std::function<bool(const StagePacket& packet, StageAnswer& answer)> collect;
  // After every stage finished: the stage's figures into the answer (timings, codes, voice).
  std::function<void(StageAnswer& answer)> finish;
  // Runs a stage of this kind in this process.
  std::function<std::unique_ptr<Stage>(const LocalStageOptions& options)> make_local;
  // engine_args keys its stages do not read: given a value other than the default, a stage
  // says so once when it starts (ignored_engine_keys, local_pipeline.h).
  std::vector<std::string> ignored_keys;
};

// What a stage receives of each packet of a source of another kind: the parts of it the
// consumer reads (vLLM-Omni's custom_process_input_func). A stage config names one in
// custom_process_input_func (a dotted path: its last part is the name); otherwise the one
// registered for the source's kind and the stage's applies, and without one the packet goes as
// it is.
struct Handoff {
  std::string name;                                      // "<from>2<to>"
  std::string from, to;                                  // the kinds it connects
  std::function<StagePacket(StagePacket packet)> apply;  // by value: the last consumer moves it
};

// The kind called `name`, or null.
const StageKind* find_stage_kind(const std::string& name);
// The registered kinds' names, sorted and joined by ", ": for messages.
std::string stage_kind_names();

// The hand-off called `name` (the last part of a dotted path), or null; the one registered for
// the kinds `from` -> `to`, or null; the hand-offs' names joined by ", ": for messages.
const Handoff* find_handoff(const std::string& name);
const Handoff* default_handoff(const std::string& from, const std::string& to);
std::string handoff_names();

}  // namespace omni::pipeline
