// Options of `vllm-omni generate`: a plain struct that CLI11 fills, and the functions that turn
// it into the request (pipeline::Request, with Qwen3-Omni's and a diffusion's parts); the offload
// flags reach the stage config through generate_backend.h. Defaults are the parts' own
// (omni_options.h, diffusion_request.h), so a flag left out
// changes nothing.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model_runner/output/wav_writer.h"
#include "model_runner/qwen3_omni/omni_options.h"
#include "model_runner/runner/diffusion_request.h"
#include "worker/config/engine_options.h"
#include "worker/pipeline/request.h"

namespace CLI {
class App;
}

namespace omni::cli {

struct GenerateOptions {
  // The request.
  std::string model;  // checkpoint directory
  std::string prompt;
  std::string messages;  // --messages FILE: an OpenAI messages list instead of prompt/system/media
  std::vector<std::string> audio;  // files, in order
  std::vector<std::string> image;
  std::string system;   // empty: no system turn
  std::string speaker;  // empty: the checkpoint's default speaker
  // "text" and/or "audio". Left at the default on a checkpoint without a talker, it falls
  // back to text (with a note); asked for explicitly, audio there is an error.
  std::vector<std::string> modalities = {"text", "audio"};
  bool modalities_given = false;  // set by the parser when --modalities appears

  // Thinker sampling.
  int64_t max_tokens;
  double temperature;
  double top_p;
  int64_t top_k;
  double repetition_penalty;
  bool greedy = false;           // OmniSampling::set_greedy(true): every stage
  std::optional<uint64_t> seed;  // OmniSampling::set_seed: every stage; unset = their defaults

  // Talker sampling.
  int64_t max_audio_frames;
  double talker_temperature;
  int64_t talker_top_k;
  double talker_top_p;
  double talker_repetition_penalty;

  // A diffusers folder (video diffusion): the request's settings (unset: the pipeline's
  // defaults; --seed sets diffusion.seed too) and the frames' file (.mp4, .png or .npy).
  models::DiffusionRequest diffusion;
  std::string output;

  // Output.
  std::string output_wav;  // empty: the waveform is not written
  std::string wav_format = "pcm16";
  bool json = false;

  // code2wav chunks (qwen3_omni::Code2WavStreamOptions).
  int64_t stream_first_chunk;
  int64_t stream_chunk;
  int64_t stream_left_context;

  // A stage pipeline instead of the in-process runner (exclusive with `model`).
  std::string stage_configs_path;
  std::string stage_overrides;  // JSON: {"<stage id>": {<engine_args key>: value}}
  double stage_init_timeout_s = 600;
  double request_timeout_s = 0;  // 0: none
  std::string auth_token_file;   // the workers' shared token (runtime.address workers)
  std::string tls_ca_file;       // reach the workers over TLS, trusting this CA
  // The options given on the command line (CLI11's names, e.g. "--cpu-offload-strategy"): with
  // a stage config, only these override the YAML.
  std::set<std::string> given;

  // The engine option flags given (--cpu-offload-*, --enable-*-offload, --dtype, ...), applied
  // to every stage by config::apply_stage_flags.
  config::EngineFlags engine;

  std::string device = "auto";  // auto | cpu (the simulated device) | cuda

  // Every default from the runner's headers.
  GenerateOptions();

  bool wants_text() const;
  bool wants_audio() const;
};

// Adds every option to `app` (the `generate` subcommand), bound to `options`, with its default
// shown in --help and validated while parsing: a bad value is a CLI::ParseError naming the flag.
void add_generate_options(CLI::App& app, GenerateOptions& options);

// The flags that only a video diffusion model reads, and those only Qwen3-Omni reads; giving one
// to the other kind of model is an error naming it (check_flags_apply, generate_video.h).
const std::vector<std::string>& diffusion_only_flags();
const std::vector<std::string>& omni_only_flags();

// The request as the options ask for it (audio per --modalities; the command turns it off on
// a checkpoint without a talker when --modalities was left at its default).
pipeline::Request to_request(const GenerateOptions& options);
// `device` with "auto" resolved (offload::resolve_device), and one info line saying which.
std::string resolved_device(const std::string& device);
models::WavFormat wav_format(const GenerateOptions& options);

}  // namespace omni::cli
