#include "worker/cli/generate_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/option_names.h"
#include "model_runner/runner/expert_offload.h"
#include "worker/cli/validators.h"

namespace omni::cli {

GenerateOptions::GenerateOptions() {
  const models::SamplingParams thinker = models::OmniSampling::default_thinker();
  const models::SamplingParams talker = models::OmniSampling::default_talker();
  const models::OmniRequest request;
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
  const models::RunnerOffloadOptions offload;
  cpu_offload_strategy = offload.strategy;
  cpu_offload_budget = offload.device_budget_bytes;
  no_pin_memory = !offload.pin_memory;
  enable_layerwise_offload = offload.layerwise;
  layerwise_num_gpu_layers = offload.num_gpu_layers;
  no_expert_prefetch = !offload.expert_prefetch;
  expert_miss_policy = offload.expert_miss_policy;
  expert_eviction = offload.expert_eviction;
  disk_read = offload.disk_read;
}

bool GenerateOptions::wants_text() const {
  return std::find(modalities.begin(), modalities.end(), "text") != modalities.end();
}

bool GenerateOptions::wants_audio() const {
  return std::find(modalities.begin(), modalities.end(), "audio") != modalities.end();
}

void add_generate_options(CLI::App& app, GenerateOptions& o) {
  app.option_defaults()->always_capture_default();

  auto* model =
      app.add_option("--model", o.model, "Qwen3-Omni checkpoint directory (Hugging Face layout)")
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
    // With --model, a strategy without components would do nothing; with a stage config it
    // applies to the YAML's components.
    const bool components = app.get_option("--cpu-offload-components")->count() > 0 ||
                            app.get_option("--cpu-offload-enabled")->count() > 0 ||
                            app.get_option("--enable-cpu-offload")->count() > 0;
    if (stage_configs->count() == 0 && !components &&
        app.get_option("--cpu-offload-strategy")->count() > 0) {
      throw CLI::RequiresError("--cpu-offload-strategy", "--cpu-offload-components");
    }
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
  auto* image =
      app.add_option("--image", o.image, "an image file (PNG, JPEG) for the prompt; repeatable")
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
         "one seed for every stage's sampler (default: their own defaults)")
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
  app.add_flag("--json", o.json,
               "print one JSON object at the end instead of streaming the text (text, "
               "token_ids, finish_reason, codes, wav, audio_seconds, sample_rate, speaker, "
               "timings, offload)");

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

  app.add_option("--cpu-offload-components", o.cpu_offload_components,
                 "enable component offload of these parts (comma-separated; thinker, talker, "
                 "code2wav, thinker.*, visual, audio_tower, language_model, lm_head, "
                 "code_predictor, talker.model.layers.*, ...) (default: none)")
      ->type_name("PATTERNS")
      ->delimiter(',')
      ->allow_extra_args(false);
  app.add_option("--cpu-offload-strategy", o.cpu_offload_strategy,
                 "alternating: a component leaves when another needs the room; sequential: "
                 "right after its forward")
      ->type_name("alternating|sequential")
      ->check(one_of(offload::names::component_policies()));
  app.add_flag("--cpu-offload-enabled", o.cpu_offload_enabled,
               "component offload of --cpu-offload-components, or of visual and audio_tower "
               "when that is not given");
  app.add_flag("--enable-cpu-offload", o.enable_cpu_offload,
               "model-level offload: thinker, talker and code2wav take turns on the device (in a "
               "stage pipeline: every stage gives its weights back when another needs the room)");
  app.add_option("--cpu-offload-budget,--gpu-memory-budget", o.cpu_offload_budget,
                 "alternating: device bytes the offloaded components may hold together before "
                 "the least recently used leave (0 = one at a time)")
      ->type_name("BYTES")
      ->transform(byte_size());
  app.add_flag("--no-pin-memory,--no-cpu-offload-pin-memory", o.no_pin_memory,
               "pageable host memory for offloaded weights (default: pinned)");
  app.add_flag("--cpu-offload-pin-memory", o.pin_memory_flag,
               "pinned host memory for offloaded weights (the default)");
  auto* layerwise =
      app.add_flag("--enable-layerwise-offload", o.enable_layerwise_offload,
                   "stream the decoder layers of the thinker and the talker through the device");
  app.add_option("--layerwise-num-gpu-layers", o.layerwise_num_gpu_layers,
                 "layerwise: layers copied ahead of the one computing")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->needs(layerwise);

  auto* experts = app.add_flag(
      "--cpu-offload-experts", o.cpu_offload_experts,
      "expert-level MoE offload: the thinker's experts live in a device expert cache "
      "(fetched when routed, next layer's predicted experts prefetched); the rest of each layer "
      "follows the other offload flags");
  app.add_option("--expert-cache-budget", o.expert_cache_budget,
                 "device bytes of the expert cache: a percentage of all experts' bytes (25%) or "
                 "bytes (805306368, 768MiB, 1.5GiB)")
      ->type_name("PERCENT|BYTES")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              size_t bytes = 0;
              double fraction = 0;
              models::parse_expert_cache_budget(text, "--expert-cache-budget", &bytes, &fraction);
              return "";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          ""))
      ->needs(experts);
  app.add_flag("--no-expert-prefetch", o.no_expert_prefetch,
               "experts: do not predict and prefetch the next MoE layer's experts")
      ->needs(experts);
  app.add_option("--expert-miss-policy", o.expert_miss_policy,
                 "experts: what a miss does: fetch it to the device, compute it on the host "
                 "where it lies, or auto (whichever the measured link and host rates say is "
                 "faster)")
      ->type_name("fetch|host|auto")
      ->check(one_of(offload::names::expert_miss_policies()))
      ->needs(experts);
  app.add_option("--expert-eviction", o.expert_eviction,
                 "experts: which expert leaves a full cache: layer (by the layers' run order) or "
                 "lru")
      ->type_name("layer|lru")
      ->check(one_of(offload::names::expert_evictions()))
      ->needs(experts);
  app.add_option("--host-memory-budget", o.host_memory_budget,
                 "host bytes for the streamed weights (layerwise layers, experts); beyond it "
                 "they stay in the checkpoint's files and are read when needed (0 = no limit)")
      ->type_name("BYTES")
      ->transform(byte_size());
  app.add_option("--disk-read", o.disk_read,
                 "how weights beyond --host-memory-budget are read: pread (a bounded pinned "
                 "cache, reader threads, read-ahead) or mmap (the OS page cache)")
      ->type_name("pread|mmap")
      ->check(one_of(offload::names::disk_reads()));

  app.add_option("--device", o.device,
                 "auto (cuda when a CUDA device is usable), cpu (the simulated device) or cuda")
      ->type_name("auto|cpu|cuda")
      ->check(one_of(offload::names::device_kinds()));
  app.add_option("--dtype", o.dtype,
                 "compute dtype; checkpoint weights of another dtype are converted to it (auto: "
                 "the checkpoint's own)")
      ->type_name("auto|float32|bfloat16|float16")
      ->check(one_of({"auto", "float32", "bfloat16", "float16"}));
}

models::OmniRequest to_request(const GenerateOptions& o) {
  models::OmniRequest r;
  r.chat.text = o.prompt;
  r.chat.audio_files = o.audio;
  r.chat.image_files = o.image;
  r.chat.system_prompt = o.system;
  r.text_output = o.wants_text();
  r.audio_output = o.wants_audio();
  r.speaker = o.speaker;
  r.max_audio_frames = o.max_audio_frames;

  auto& thinker = r.sampling.thinker;
  thinker.max_new_tokens = o.max_tokens;
  thinker.temperature = o.temperature;
  thinker.top_p = o.top_p;
  thinker.top_k = o.top_k;
  thinker.repetition_penalty = o.repetition_penalty;
  // The runner derives the talker's max_new_tokens from max_audio_frames.
  auto& talker = r.sampling.talker;
  talker.temperature = o.talker_temperature;
  talker.top_k = o.talker_top_k;
  talker.top_p = o.talker_top_p;
  talker.repetition_penalty = o.talker_repetition_penalty;
  // After the fields above: greedy and the seed apply to every stage.
  if (o.greedy) r.sampling.set_greedy(true);
  if (o.seed) r.sampling.set_seed(*o.seed);

  r.stream.first_chunk_frames = o.stream_first_chunk;
  r.stream.chunk_frames = o.stream_chunk;
  r.stream.left_context_frames = o.stream_left_context;
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
