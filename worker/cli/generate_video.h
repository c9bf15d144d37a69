// `vllm-omni generate` on a diffusion pipeline (a diffusers Wan or Qwen-Image folder as --model,
// or a stage config with a diffusion stage): the flags that apply, the progress bar, the frames
// or images written by extension (frames_writer.h) and the --json report.
#pragma once

#include <cstdint>

#include "worker/cli/generate_command.h"
#include "worker/cli/generate_options.h"

namespace omni::cli {

// What a pipeline answers with, as far as the flags are concerned.
enum class DiffusionOutput { kNone, kVideo, kImages };

// The backend's: video, images, or neither (a text / speech model).
DiffusionOutput diffusion_output(GenerateBackend& backend);

// Throws BadInput naming the first flag given that the model does not read (a diffusion flag
// on Qwen3-Omni, a Qwen3-Omni flag on a diffusion model, a video flag on an image model and the
// reverse), or a bad --output / --image for the model: more --image files than
// `max_input_images` on an image model (0: it makes images from text only; -1: not known before
// the stages are up, the stage refuses a request it cannot run).
void check_flags_apply(const GenerateOptions& options, DiffusionOutput output,
                       int64_t max_input_images = -1);

// Runs the request on `backend` (answers_video()), shows a progress bar on a terminal
// (io.progress), writes --output, and with --json prints one object: output, frames, height,
// width, fps, finish_reason, timings (load_ms, total_ms, generate_ms, step_ms [...],
// step_ms_mean, decode_ms, write_ms), peak_device_bytes, peak_host_bytes, offload.
void run_video(const GenerateOptions& options, const CommandIo& io, GenerateBackend& backend,
               double load_ms);

// The same for an image model (answers_images()): writes the images (.png, numbered when
// several, or .npy [N, H, W, 3]) and reports images instead of frames and fps.
void run_images(const GenerateOptions& options, const CommandIo& io, GenerateBackend& backend,
                double load_ms);

}  // namespace omni::cli
