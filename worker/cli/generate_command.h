// `vllm-omni generate`: loads the checkpoint into an OmniRunner, runs one request and reports
// it: the text streamed to stdout as it is generated (or one JSON object at the end with
// --json), the waveform written to --output-wav.
#pragma once

#include <iosfwd>
#include <string>

#include "worker/cli/generate_options.h"

namespace omni::cli {

struct CommandIo {
  std::ostream& out;  // the answer: streamed text, or the JSON object
  std::ostream& err;  // notes, progress, errors
  bool progress;      // progress lines (loading, generating, writing) on `err`
};

// Returns the exit status: 0, or 1 after a runtime error (bad model directory, unknown
// speaker, unreadable input, ...), reported as one line "vllm-omni: error: ..." on io.err.
int run_generate(const GenerateOptions& options, const CommandIo& io);

// `message` on one line (line breaks become spaces): every error the CLI prints is one line.
std::string one_line(std::string message);

}  // namespace omni::cli
