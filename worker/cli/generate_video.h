// `vllm-omni generate` on a video diffusion pipeline (a diffusers Wan folder as --model, or a
// stage config with a diffusion stage): the flags that apply, the progress bar, the frames
// written by extension (frames_writer.h) and the --json report.
#pragma once

#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"

namespace omni::cli {

// Throws BadInput naming the first flag given that the model does not read (a video flag on
// Qwen3-Omni, a Qwen3-Omni flag on a video model), or a bad --output / --image for video.
void check_flags_apply(const GenerateOptions& options, bool video);

// Runs the request on `backend` (answers_video()), shows a progress bar on a terminal
// (io.progress), writes --output, and with --json prints one object: output, frames, height,
// width, fps, finish_reason, timings (load_ms, total_ms, generate_ms, step_ms [...],
// step_ms_mean, decode_ms, write_ms), peak_device_bytes, peak_host_bytes, offload.
void run_video(const GenerateOptions& options, const CommandIo& io, GenerateBackend& backend,
               double load_ms);

}  // namespace omni::cli
