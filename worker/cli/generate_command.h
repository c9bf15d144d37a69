// `vllm-omni generate`: runs one request and reports it: the text streamed to stdout as it is
// generated (or one JSON object at the end with --json), the waveform written to --output-wav.
// Both --model (the checkpoint's stages in this process) and --stage-configs-path (the stage
// workers of the config) run one Pipeline (generate_backend.h).
#pragma once

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>

#include "worker/pipeline/pipeline.h"

#include "worker/cli/command_errors.h"
#include "worker/cli/generate_options.h"

namespace omni::cli {

struct CommandIo {
  std::ostream& out;  // the answer: streamed text, or the JSON object
  std::ostream& err;  // notes, progress, errors
  bool progress;      // progress lines (loading, generating, writing) on `err`
};

// What runs the request (generate_backend.h).
class GenerateBackend {
 public:
  virtual ~GenerateBackend() = default;
  // The pipeline answers with audio.
  virtual bool answers_audio() = 0;
  // The pipeline answers with video (a diffusion stage).
  virtual bool answers_video() = 0;
  // The pipeline answers with still images (an image diffusion stage).
  virtual bool answers_images() = 0;
  // Called with each diffusion step's metrics (step, steps, timestep, step_ms) during generate.
  virtual void set_progress(std::function<void(const std::map<std::string, double>&)> fn) = 0;
  // `on_text` gets the text as it is generated (whole UTF-8 characters). `media`: the inputs as
  // bytes (a conversation read from --messages) instead of the request's files.
  virtual pipeline::PipelineResult generate(
      const pipeline::Request& request, const std::function<void(const std::string&)>& on_text,
      const std::vector<pipeline::MediaFile>* media = nullptr) = 0;
  // Offload statistics as a JSON value.
  virtual std::string offload_json() = 0;
};

// Returns the exit status: 0, or 1 after a runtime error (bad model directory, unknown
// speaker, unreadable input, ...), reported as one line "vllm-omni: error: ..." on io.err.
int run_generate(const GenerateOptions& options, const CommandIo& io);

}  // namespace omni::cli
