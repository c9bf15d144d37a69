#include "worker/cli/generate_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "cpu_offload/transfer_engine.h"
#include "worker/cli/engine_flags.h"
#include "worker/cli/validators.h"

namespace omni::cli {

GenerateOptions::GenerateOptions() {
  const models::SamplingParams thinker = models::OmniSampling::default_thinker();
  const models::SamplingParams talker = models::OmniSampling::default_talker();
  const models::OmniOptions request;
  const models::qwen3_omni::Code2WavStreamOptions stream;
  max_tokens = thinker.max_new_tokens;
  temperature = thinker.temperature;
  top_p = thinker.top_p;
  top_k = thinker.top_k;
  repetition_penalty = thinker.repetition_penalty;
  max_audio_frames = request.max_audio_frames;
  talker_temperature = talker.temperature;
  talker_top_k = talker.top_k;
  talker_top_p = talker.top_p;
  talker_repetition_penalty = talker.repetition_penalty;
  stream_first_chunk = stream.first_chunk_frames;
  stream_chunk = stream.chunk_frames;
  stream_left_context = stream.left_context_frames;
}

bool GenerateOptions::wants_text() const {
  return std::find(modalities.begin(), modalities.end(), "text") != modalities.end();
}

bool GenerateOptions::wants_audio() const {
  return std::find(modalities.begin(), modalities.end(), "audio") != modalities.end();
}

namespace {

// An optional request field: set only when the flag is given, so the model's default applies.
template <typename T>
CLI::Option* add_optional(CLI::App& app, const std::string& name, std::optional<T>& field,
                          const std::string& help, const std::string& type) {
  return app
      .add_option_function<T>(
          name, [&field](const T& value) { field = value; }, help)
      ->type_name(type);
}

std::string lower_extension(const std::string& path) {
  const auto dot = path.rfind('.');
  std::string ext = dot == std::string::npos ? "" : path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// The diffusion flags (a diffusers folder as --model); defaults are the diffusers pipeline's call
// defaults, which models::WanRequest and models::QwenImageRequest keep.
void add_diffusion_options(CLI::App& app, GenerateOptions& o) {
  auto& d = o.diffusion;
  add_optional(app, "--negative-prompt", d.negative_prompt,
               "diffusion: what the video or image should not show (classifier-free guidance)",
               "TEXT");
  add_optional(app, "--height", d.height,
               "diffusion: height in pixels (default: video 480, image 1024, an edit its "
               "image's size at 1024x1024 pixels)",
               "N")
      ->check(integer_at_least(16));
  add_optional(app, "--width", d.width,
               "diffusion: width in pixels (default: video 832, image 1024)", "N")
      ->check(integer_at_least(16));
  add_optional(app, "--num-frames", d.num_frames, "video: frames, 4k + 1 (default 81)", "N")
      ->check(integer_at_least(1));
  add_optional(app, "--num-inference-steps", d.num_inference_steps,
               "diffusion: denoising steps (default 50)", "N")
      ->check(integer_at_least(1));
  add_optional(app, "--guidance-scale", d.guidance_scale,
               "video: classifier-free guidance scale, > 1 uses --negative-prompt (default 5)", "X")
      ->check(number_in(0, HUGE_VAL));
  add_optional(app, "--guidance-scale-2", d.guidance_scale_2,
               "video: the low-noise expert's (transformer_2) guidance scale (default: "
               "--guidance-scale)",
               "X")
      ->check(number_in(0, HUGE_VAL));
  add_optional(app, "--boundary-ratio", d.boundary_ratio,
               "video: switch from transformer to transformer_2 below this fraction of the "
               "training timesteps (default: model_index.json's)",
               "X")
      ->check(number_in(0, 1));
  add_optional(app, "--true-cfg-scale", d.true_cfg_scale,
               "image: true classifier-free guidance scale; guides only with --negative-prompt "
               "and a scale > 1, as diffusers (default 4)",
               "X")
      ->check(number_in(0, HUGE_VAL));
  add_optional(app, "--num-images", d.num_images, "image: images per prompt (default 1)", "N")
      ->check(integer_at_least(1));
  add_optional(app, "--flow-shift", d.flow_shift,
               "video: the scheduler's flow shift (default: scheduler_config.json's)", "X")
      ->check(number_in(0, HUGE_VAL, /*min_open=*/true));
  add_optional(app, "--max-sequence-length", d.max_sequence_length,
               "diffusion: prompt tokens the text encoder sees (default 512)", "N")
      ->check(integer_at_least(1));
  app.add_option("--output", o.output,
                 "diffusion: write the frames or images here, by extension: .mp4 (video: H.264 at "
                 "the model's frame rate), .png (one file per frame or image: NAME_0000.png, ... "
                 "when several) or .npy (float32 [N, H, W, 3] in [0, 1], as diffusers' "
                 "output_type=\"np\")")
      ->type_name("FILE.mp4|.png|.npy")
      ->check(
          [](const std::string& path) -> std::string {
            const std::string ext = lower_extension(path);
            if (ext == ".mp4" || ext == ".png" || ext == ".npy") return "";
            return "'" + path + "' must end in .mp4, .png or .npy";
          },
          "");
}

}  // namespace

// clang-format off
const std::vector<std::string>& diffusion_only_flags() {
  static const std::vector<std::string> flags = {
      "--negative-prompt", "--height", "--width", "--num-frames", "--num-inference-steps",
      "--guidance-scale", "--guidance-scale-2", "--boundary-ratio", "--flow-shift",
      "--true-cfg-scale", "--num-images", "--max-sequence-length", "--output"};
  return flags;
}

const std::vector<std::string>& omni_only_flags() {
  static const std::vector<std::string> flags = {
      "--messages", "--audio", "--system", "--speaker", "--modalities", "--max-tokens",
      "--max-audio-frames", "--greedy", "--temperature", "--top-p", "--top-k",
      "--repetition-penalty", "--talker-temperature", "--talker-top-k", "--talker-top-p",
      "--talker-repetition-penalty", "--output-wav", "--wav-format", "--stream-first-chunk",
      "--stream-chunk", "--stream-left-context"};
  return flags;
}
// clang-format on

void add_generate_options(CLI::App& app, GenerateOptions& o) {
  app.option_defaults()->always_capture_default();

  auto* model =
      app.add_option("--model", o.model,
                     "Qwen3-Omni checkpoint directory (Hugging Face layout), or a diffusers "
                     "Wan folder (model_index.json: one video diffusion stage)")
          ->type_name("DIR");
  auto* stage_configs =
      app.add_option("--stage-configs-path", o.stage_configs_path,
                     "run through stage workers as this stage YAML describes (one gRPC worker "
                     "process per stage, started on loopback or reached at runtime.address)")
          ->type_name("FILE")
          ->excludes(model);
  app.add_option("--stage-overrides", o.stage_overrides,
                 "per-stage settings as JSON, e.g. '{\"1\": {\"cpu_offload_enabled\": true}}' "
                 "(wins over every other source; with --model the stages are 0 thinker, 1 "
                 "talker, 2 code2wav)")
      ->type_name("JSON");
  app.add_option("--stage-init-timeout", o.stage_init_timeout_s,
                 "with --stage-configs-path: seconds a stage worker may take to load and answer")
      ->type_name("SECONDS")
      ->check(number_in(0, HUGE_VAL, /*min_open=*/true))
      ->needs(stage_configs);
  app.add_option("--request-timeout", o.request_timeout_s,
                 "seconds the request may take before it fails naming the stages still at work "
                 "(0 = no limit)")
      ->type_name("SECONDS")
      ->check(number_in(0, HUGE_VAL));
  app.add_option("--auth-token-file", o.auth_token_file,
                 "with --stage-configs-path: the token the workers at runtime.address expect")
      ->type_name("FILE")
      ->check(CLI::ExistingFile)
      ->needs(stage_configs);
  app.add_option("--tls-ca-file", o.tls_ca_file,
                 "with --stage-configs-path: the CA (PEM) that signed the workers' certificates: "
                 "reach the workers at runtime.address over TLS")
      ->type_name("FILE")
      ->check(CLI::ExistingFile)
      ->needs(stage_configs);
  // Which options were given: with a stage config, only those override the YAML.
  app.parse_complete_callback([&app, &o, model, stage_configs] {
    if (model->count() == 0 && stage_configs->count() == 0) {
      throw CLI::RequiredError("--model or --stage-configs-path");
    }
    // With a stage config, the YAML may have turned on what a flag refines.
    if (stage_configs->count() == 0) check_engine_flag_needs(app);
    if (app.get_option("--prompt")->count() == 0 && app.get_option("--messages")->count() == 0) {
      throw CLI::RequiredError("--prompt or --messages");
    }
    o.given.clear();
    for (const CLI::Option* opt : app.get_options()) {
      if (opt->count() > 0) o.given.insert(opt->get_name());
    }
  });
  auto* prompt = app.add_option("--prompt", o.prompt, "the user's text")->type_name("TEXT");
  auto* audio = app.add_option("--audio", o.audio,
                               "an audio file (WAV, FLAC, OGG) for the prompt; repeatable")
                    ->type_name("FILE")
                    ->allow_extra_args(false);
  auto* image = app.add_option("--image", o.image,
                               "an image file (PNG, JPEG) for the prompt; repeatable; video (TI2V "
                               "folders): the first frame, --height x --width; image editing "
                               "(QwenImageEdit folders): the image(s) to edit")
                    ->type_name("FILE")
                    ->allow_extra_args(false);
  auto* system =
      app.add_option("--system", o.system, "a system turn before the user's (default: none)")
          ->type_name("TEXT");
  app.add_option("--messages", o.messages,
                 "a conversation to answer instead of --prompt: a JSON file holding an OpenAI "
                 "chat `messages` list (system, user and assistant turns; media as data: URLs "
                 "or base64 input_audio), or a request object with one")
      ->type_name("FILE")
      ->excludes(prompt)
      ->excludes(audio)
      ->excludes(image)
      ->excludes(system);
  app.add_option("--speaker", o.speaker,
                 "voice, a speaker name of the checkpoint, any case (default: its default, "
                 "Ethan for Qwen3-Omni)")
      ->type_name("NAME");
  app.add_option("--modalities", o.modalities,
                 "what to answer with: text, audio or both (a checkpoint without a talker "
                 "answers in text when this is left out)")
      ->type_name("text|audio|text,audio")
      ->default_str("text,audio")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(one_of({"text", "audio"}))
      ->each([&o](const std::string&) { o.modalities_given = true; });

  app.add_option("--max-tokens", o.max_tokens, "most tokens the thinker generates")
      ->type_name("N")
      ->check(integer_at_least(1));
  app.add_option("--max-audio-frames", o.max_audio_frames,
                 "most codec frames the talker generates (80 ms each)")
      ->type_name("N")
      ->check(integer_at_least(1));
  app.add_flag("--greedy", o.greedy,
               "argmax after the repetition penalty in every stage (thinker, talker, code "
               "predictor); overrides the temperatures and top-k/top-p");
  app.add_option_function<uint64_t>(
         "--seed", [&o](const uint64_t& seed) { o.seed = seed; },
         "one seed for every stage's sampler (default: their own defaults); video: "
         "the initial noise, as diffusers' torch.Generator(\"cpu\").manual_seed (default 0)")
      ->type_name("N")
      ->check(unsigned_integer());
  app.add_option("--temperature", o.temperature, "thinker: temperature (0 = greedy)")
      ->type_name("X")
      ->check(number_in(0, HUGE_VAL));
  app.add_option("--top-p", o.top_p, "thinker: nucleus sampling mass (1 = off)")
      ->type_name("X")
      ->check(number_in(0, 1, /*min_open=*/true));
  app.add_option("--top-k", o.top_k, "thinker: keep the k most likely tokens (0 = off)")
      ->type_name("N")
      ->check(integer_at_least(0));
  app.add_option("--repetition-penalty", o.repetition_penalty,
                 "thinker: penalty on tokens of the prompt and the answer (1 = off)")
      ->type_name("X")
      ->check(number_in(0, HUGE_VAL, /*min_open=*/true));
  app.add_option("--talker-temperature", o.talker_temperature, "talker: temperature (0 = greedy)")
      ->type_name("X")
      ->check(number_in(0, HUGE_VAL));
  app.add_option("--talker-top-k", o.talker_top_k, "talker: keep the k most likely codes (0 = off)")
      ->type_name("N")
      ->check(integer_at_least(0));
  app.add_option("--talker-top-p", o.talker_top_p, "talker: nucleus sampling mass (1 = off)")
      ->type_name("X")
      ->check(number_in(0, 1, /*min_open=*/true));
  app.add_option("--talker-repetition-penalty", o.talker_repetition_penalty,
                 "talker: penalty on the codes generated so far (1 = off)")
      ->type_name("X")
      ->check(number_in(0, HUGE_VAL, /*min_open=*/true));

  app.add_option("--output-wav", o.output_wav,
                 "write the waveform (24 kHz mono) here; replaced only once complete (default: "
                 "not written)")
      ->type_name("FILE");
  app.add_option("--wav-format", o.wav_format,
                 "pcm16: 16-bit PCM (x * 32767, rounded); f32: 32-bit float, bit for bit")
      ->type_name("pcm16|f32")
      ->check(one_of({"pcm16", "f32"}));
  app.add_flag(
      "--json", o.json,
      "print one JSON object at the end instead of streaming the text (text, "
      "token_ids, finish_reason, codes, wav, audio_seconds, sample_rate, speaker, "
      "timings, offload; for video: output, frames, height, width, fps, finish_reason, timings, "
      "peak_device_bytes, peak_host_bytes, offload)");

  app.add_option("--stream-first-chunk", o.stream_first_chunk,
                 "code2wav: frames of the first chunk (small, so that audio starts early)")
      ->type_name("N")
      ->check(integer_at_least(1));
  app.add_option("--stream-chunk", o.stream_chunk, "code2wav: frames of each later chunk")
      ->type_name("N")
      ->check(integer_at_least(1));
  app.add_option("--stream-left-context", o.stream_left_context,
                 "code2wav: frames before a chunk decoded with it for continuity")
      ->type_name("N")
      ->check(integer_at_least(0));

  add_diffusion_options(app, o);

  add_engine_flags(app, o.engine);

  app.add_option("--device", o.device,
                 "with --model: auto (cuda when a CUDA device is usable), cpu (the simulated "
                 "device) or cuda (a stage YAML names its devices in runtime.devices)")
      ->type_name("auto|cpu|cuda")
      ->check(one_of(offload::names::device_kinds()))
      ->excludes(stage_configs);
}

pipeline::Request to_request(const GenerateOptions& o) {
  pipeline::Request r;
  r.chat.text = o.prompt;
  r.chat.audio_files.assign(o.audio.begin(), o.audio.end());
  r.chat.image_files.assign(o.image.begin(), o.image.end());
  r.chat.system_prompt = o.system;
  r.text_output = o.wants_text();
  r.audio_output = o.wants_audio();
  r.voice = o.speaker;

  auto& omni = r.parts.get<models::OmniOptions>();
  omni.max_audio_frames = o.max_audio_frames;
  auto& thinker = omni.sampling.thinker;
  thinker.max_new_tokens = o.max_tokens;
  thinker.temperature = o.temperature;
  thinker.top_p = o.top_p;
  thinker.top_k = o.top_k;
  thinker.repetition_penalty = o.repetition_penalty;
  // The runner derives the talker's max_new_tokens from max_audio_frames.
  auto& talker = omni.sampling.talker;
  talker.temperature = o.talker_temperature;
  talker.top_k = o.talker_top_k;
  talker.top_p = o.talker_top_p;
  talker.repetition_penalty = o.talker_repetition_penalty;
  // After the fields above: greedy and the seed apply to every stage.
  if (o.greedy) omni.sampling.set_greedy(true);
  if (o.seed) omni.sampling.set_seed(*o.seed);

  omni.stream.first_chunk_frames = o.stream_first_chunk;
  omni.stream.chunk_frames = o.stream_chunk;
  omni.stream.left_context_frames = o.stream_left_context;
  auto& diffusion = r.parts.get<models::DiffusionRequest>();
  diffusion = o.diffusion;
  if (o.seed) diffusion.seed = *o.seed;
  return r;
}

std::string resolved_device(const std::string& device) {
  if (device != "auto") return device;
  std::string why;
  std::string resolved = offload::resolve_device(device, &why);
  log_info("--device auto: ", resolved == "cuda" ? "cuda" : "cpu, the simulated device", " (", why,
           ")");
  return resolved;
}

models::WavFormat wav_format(const GenerateOptions& o) {
  return models::parse_wav_format(o.wav_format);
}

}  // namespace omni::cli
