#include "model_runner/runner/omni_runner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"
#include "cpu_offload/logging.h"
#include "model_runner/generation/generate.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/qwen3_omni/omni_model.h"
#include "model_runner/qwen3_omni/talker_generate.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/chat_inputs.h"
#include "model_runner/runner/expert_offload.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {

using qwen3_omni::Qwen3Omni;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The reference decodes the whole answer in chunks of 300 frames with 25 frames of context.
constexpr int64_t kReferenceChunkFrames = 300;
constexpr int64_t kReferenceLeftContext = 25;

}  // namespace

// ---------------------------------------------------------------------------- sampling defaults

SamplingParams OmniSampling::default_thinker() {
  SamplingParams p;
  p.temperature = 0.4;
  p.top_p = 0.9;
  p.top_k = 1;
  p.repetition_penalty = 1.05;
  p.max_new_tokens = 2048;
  return p;
}

SamplingParams OmniSampling::default_talker() {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 50;
  p.top_p = 1.0;
  p.repetition_penalty = 1.05;
  p.max_new_tokens = 4097;  // 4096 frames: the last sampled code is never fed back
  return p;
}

SamplingParams OmniSampling::default_code_predictor() {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 50;
  p.top_p = 0.8;
  return p;
}

void OmniSampling::set_greedy(bool greedy) {
  thinker.greedy = greedy;
  talker.greedy = greedy;
  code_predictor.greedy = greedy;
}

void OmniSampling::set_seed(uint64_t seed) {
  thinker.seed = seed;
  talker.seed = seed;
  code_predictor.seed = seed;
}

// ---------------------------------------------------------------------------- names

std::vector<std::string> omni_component_paths(const std::vector<std::string>& names) {
  static const std::vector<std::string> kThinkerParts = {"visual", "audio_tower", "model",
                                                         "lm_head"};
  std::vector<std::string> paths;
  for (std::string name : names) {
    OMNI_CHECK(!name.empty(), "cpu_offload_components: an entry is empty");
    // The thinker's parts by their short names (as the thinker stage's config writes them).
    std::string rest;
    if (name.rfind("thinker.", 0) == 0) {
      rest = name.substr(8);
    } else if (name == "language_model" || name.rfind("language_model.", 0) == 0) {
      rest = name;
    } else {
      const auto head = name.substr(0, name.find('.'));
      if (std::find(kThinkerParts.begin(), kThinkerParts.end(), head) != kThinkerParts.end()) {
        rest = name;
      }
    }
    if (!rest.empty()) {
      if (rest == "language_model" || rest.rfind("language_model.", 0) == 0) {
        rest = "model" + rest.substr(14);
      }
      paths.push_back("thinker." + rest);
    } else if (name == "code_predictor" || name.rfind("code_predictor.", 0) == 0) {
      paths.push_back("talker." + name);
    } else {
      paths.push_back(name);  // thinker, talker, code2wav, talker.model.layers.*, ...
    }
  }
  return paths;
}

// ---------------------------------------------------------------------------- runner

struct OmniRunner::State {
  OmniRunnerOptions options;
  std::shared_ptr<offload::TransferEngine> engine;
  qwen3_omni::ThinkerConfig thinker_cfg;
  qwen3_omni::TalkerConfig talker_cfg;
  qwen3_omni::Code2WavConfig code2wav_cfg;
  qwen3_omni::OmniTokenIds ids;
  bool has_talker = false;
  std::shared_ptr<Qwen3Omni> model;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatPreprocessor preprocessor;
  std::unique_ptr<offload::OffloadBackend> backend;
  // Expert offload of the thinker's MoE experts (cpu_offload_experts); gone before backend.
  std::unique_ptr<offload::ExpertCache> expert_cache;
  std::unique_ptr<ExpertOffload> expert_offload;
  std::vector<int64_t> stop_tokens;
  double load_ms = 0;
  // One request at a time: the stages share the model's weights, KV-free modules and the
  // offload backend's bindings.
  std::mutex mutex;
};

OmniRunner::OmniRunner() : s_(std::make_unique<State>()) {}
OmniRunner::~OmniRunner() = default;

std::unique_ptr<OmniRunner> OmniRunner::load(const OmniRunnerOptions& options,
                                             std::shared_ptr<offload::TransferEngine> engine) {
  namespace fs = std::filesystem;
  const auto start = Clock::now();
  OMNI_CHECK(engine != nullptr, "OmniRunner::load needs a transfer engine");
  OMNI_CHECK(fs::is_directory(options.model_dir), "model directory ", options.model_dir,
             " does not exist or is not a directory");
  std::unique_ptr<OmniRunner> r(new OmniRunner());
  State& s = *r->s_;
  s.options = options;
  s.engine = engine;

  const auto config = HfConfig::load(options.model_dir);
  s.thinker_cfg = qwen3_omni::parse_thinker_config(config);
  s.has_talker = qwen3_omni::has_speech_output(config);
  if (s.has_talker) {
    s.talker_cfg = qwen3_omni::parse_talker_config(config, s.thinker_cfg);
    s.code2wav_cfg = qwen3_omni::parse_code2wav_config(config);
    s.ids = qwen3_omni::parse_omni_token_ids(config, s.thinker_cfg);
    OMNI_CHECK(s.code2wav_cfg.num_quantizers == s.talker_cfg.num_code_groups, config.source(),
               ": code2wav_config.num_quantizers ", s.code2wav_cfg.num_quantizers,
               " differs from talker_config.num_code_groups ", s.talker_cfg.num_code_groups);
    // The talker may sample ids below vocab - 1024 (the rest are special): all must be codes.
    OMNI_CHECK(s.talker_cfg.text.vocab_size - 1024 <= s.code2wav_cfg.codebook_size, config.source(),
               ": talker_config.text_config.vocab_size - 1024 = ",
               s.talker_cfg.text.vocab_size - 1024, " sampleable codes exceed ",
               "code2wav_config.codebook_size ", s.code2wav_cfg.codebook_size);
    OMNI_CHECK(s.code2wav_cfg.codebook_size == s.talker_cfg.code_predictor.vocab_size,
               config.source(), ": code2wav_config.codebook_size ", s.code2wav_cfg.codebook_size,
               " differs from talker_config.code_predictor_config.vocab_size ",
               s.talker_cfg.code_predictor.vocab_size);
  }
  const auto checkpoint = SafetensorsCheckpoint::open(options.model_dir);
  s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(options.model_dir));
  s.preprocessor = ChatPreprocessor::load(options.model_dir, s.thinker_cfg);

  s.model = std::make_shared<Qwen3Omni>(s.thinker_cfg, s.has_talker ? &s.talker_cfg : nullptr,
                                        s.has_talker ? &s.code2wav_cfg : nullptr,
                                        resolve_dtype(options.dtype, checkpoint, ""));
  // Conversions (when the dtype asked for is not the checkpoint's) are left to the offload
  // engine, unit by unit.
  std::unordered_map<std::string, at::ScalarType> convert;
  // Where each tensor lies in the files, for the disk tier under a host memory budget.
  offload::TensorFiles disk_files;
  const bool disk = options.offload.host_memory_budget_bytes > 0;
  auto report = load_weights(s.model->thinker(), checkpoint, s.thinker_cfg.weight_prefix, true);
  defer_conversions(report, "thinker.", convert);
  if (disk) add_disk_files(report, "thinker.", disk_files);
  if (s.has_talker) {
    const auto talker = load_weights(s.model->talker(), checkpoint, "talker.", true);
    const auto code2wav = load_weights(s.model->code2wav(), checkpoint, "code2wav.", true);
    defer_conversions(talker, "talker.", convert);
    defer_conversions(code2wav, "code2wav.", convert);
    if (disk) {
      add_disk_files(talker, "talker.", disk_files);
      add_disk_files(code2wav, "code2wav.", disk_files);
    }
    report.tensors += talker.tensors + code2wav.tensors;
    report.bytes += talker.bytes + code2wav.bytes;
    report.converted += talker.converted + code2wav.converted;
  }
  log_info("loaded ", report.tensors, " tensors (", report.bytes, " bytes) from ",
           options.model_dir, report.converted ? " with dtype conversion" : "",
           s.has_talker ? "" : " (no talker: text output only)");

  // Offload after the weights are bound: the backend moves them into its stores.
  auto [oc, spec] = offload_setup(options.offload, "thinker.", s.has_talker, omni_component_paths);
  oc.convert_dtypes = std::move(convert);
  oc.disk_files = std::move(disk_files);
  {
    // The checkpoint is read here, as the weights are placed: for a large one, the long part.
    offload::LoadProgress progress("placing the weights of " + options.model_dir,
                                   offload::module_tensor_bytes(*s.model));
    s.backend = offload::apply_offload(*s.model, spec, oc, engine);
    s.expert_cache = offload::make_expert_cache(*s.model, s.backend->plan(), oc, engine);
  }
  if (s.expert_cache) {
    s.expert_offload =
        std::make_unique<ExpertOffload>(s.model->thinker().language_model(), "thinker.model.",
                                        *s.expert_cache, options.offload.expert_prefetch);
  }
  s.model->set_device(engine->compute_device());

  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = s.tokenizer->find_token(name)) s.stop_tokens.push_back(*id);
  }
  s.load_ms = ms_since(start);
  return r;
}

bool OmniRunner::has_talker() const { return s_->has_talker; }

std::vector<std::string> OmniRunner::speakers() const {
  std::vector<std::string> names;
  for (const auto& [name, id] : s_->talker_cfg.speakers) names.push_back(name);
  return names;
}

std::string OmniRunner::default_speaker() const {
  // The reference's default is Ethan; a checkpoint without that name falls back to its first.
  const auto names = speakers();
  if (names.empty()) return "";
  return std::find(names.begin(), names.end(), "ethan") != names.end() ? "ethan" : names.front();
}

const Tokenizer& OmniRunner::tokenizer() const { return *s_->tokenizer; }
offload::OffloadBackend& OmniRunner::offload() { return *s_->backend; }
offload::ExpertCache* OmniRunner::expert_cache() { return s_->expert_cache.get(); }
qwen3_omni::Qwen3Omni& OmniRunner::model() { return *s_->model; }

OmniResult OmniRunner::generate(const OmniRequest& request, const OmniCallbacks& callbacks) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mutex);
  auto forward = s.backend->forward_scope();  // every stage's forwards of this request
  const auto start = Clock::now();
  OMNI_CHECK(request.text_output || request.audio_output,
             "the request asks for no output: set text and/or audio");
  OMNI_CHECK(!request.audio_output || s.has_talker, "audio output was requested but ",
             s.options.model_dir,
             " has no talker (enable_audio_output is false or the checkpoint is thinker-only)");
  OMNI_CHECK(request.max_audio_frames >= 1, "max_audio_frames must be >= 1, got ",
             request.max_audio_frames);
  OMNI_CHECK(request.stop_strings.empty(),
             "stop strings are applied by the stage pipeline, not by OmniRunner");
  int64_t speaker = -1;
  std::string speaker_name;
  if (request.audio_output) {
    speaker_name = request.speaker.empty() ? default_speaker() : request.speaker;
    speaker = qwen3_omni::speaker_codec_id(s.talker_cfg, speaker_name);
    request.stream.validate();
  }
  at::NoGradGuard no_grad;
  OmniResult result;
  result.audio_finish_reason = "none";
  result.timings.load_ms = s.load_ms;

  // ---- thinker
  auto& thinker = s.model->thinker();
  const auto inputs = s.preprocessor.prepare(request.chat, *s.tokenizer, s.thinker_cfg);
  SamplingParams thinker_params = request.sampling.thinker;
  if (thinker_params.stop_token_ids.empty()) thinker_params.stop_token_ids = s.stop_tokens;
  thinker_params.max_context = thinker.config().text.max_position_embeddings;
  const int64_t capture = request.audio_output ? s.talker_cfg.accept_hidden_layer : -1;
  auto state = thinker.new_state(capture);
  const auto thinker_start = Clock::now();
  Clock::time_point first_token_at;
  const auto generation = generate_tokens(
      [&](int64_t step, const std::vector<int64_t>& generated) -> at::Tensor {
        if (step == 0) {
          auto logits = thinker.prefill(inputs, state)[0];
          first_token_at = Clock::now();
          return logits;
        }
        return thinker.decode(generated.back(), state);
      },
      thinker_params,
      [&](int64_t token) {
        if (request.text_output && callbacks.on_token) return callbacks.on_token(token);
        return true;
      },
      inputs.input_ids);
  result.tokens = generation.tokens;
  result.finish_reason = generation.finish_reason;
  if (!result.tokens.empty()) {
    result.timings.thinker_prefill_ms =
        std::chrono::duration<double, std::milli>(first_token_at - thinker_start).count();
    const double decode_s = std::chrono::duration<double>(Clock::now() - first_token_at).count();
    if (result.tokens.size() > 1 && decode_s > 0) {
      result.timings.thinker_decode_tokens_per_s =
          static_cast<double>(result.tokens.size() - 1) / decode_s;
    }
  }

  // ---- talker + code predictor + code2wav
  const bool speak = request.audio_output && generation.finish_reason != "cancelled";
  if (speak && result.tokens.size() < 2) {
    log_warning("the thinker generated ", result.tokens.size(),
                " token(s): too little text to speak, no audio");
  }
  if (speak && result.tokens.size() >= 2) {
    auto& talker = s.model->talker();
    auto& code2wav = s.model->code2wav();
    const auto& tc = s.talker_cfg;
    qwen3_omni::ThinkerHandoff handoff;
    handoff.prompt_ids = inputs.input_ids;
    handoff.generated = result.tokens;
    handoff.embeds = at::cat(state.embeds, 0);
    handoff.hidden = at::cat(state.hidden, 0);
    handoff.tts_embeds = thinker.embed({s.ids.tts_bos, s.ids.tts_eos, s.ids.tts_pad});
    const auto hids =
        qwen3_omni::handoff_ids(s.thinker_cfg, tc, s.ids, speaker, thinker_params.stop_token_ids);
    const auto prompt = qwen3_omni::build_talker_prompt(handoff, hids);
    state = thinker.new_state();  // the thinker's rows are no longer needed

    std::unique_ptr<qwen3_omni::Code2WavStreamer> streamer;
    if (request.stream_audio) {
      streamer = std::make_unique<qwen3_omni::Code2WavStreamer>(code2wav, request.stream);
    }
    double code2wav_ms = 0;
    bool cancelled = false;
    const auto emit_audio = [&](const at::Tensor& samples) {
      if (samples.numel() == 0) return;
      if (result.streamed_samples == 0) result.timings.time_to_first_audio_ms = ms_since(start);
      result.streamed_samples += samples.numel();
      if (callbacks.on_audio && !callbacks.on_audio(samples)) cancelled = true;
    };

    const auto run = qwen3_omni::run_talker(
        talker, prompt, inputs.image_grids, request.sampling.talker,
        request.sampling.code_predictor, request.max_audio_frames,
        [&](const std::vector<int64_t>& frame) {
          if (callbacks.on_frame && !callbacks.on_frame(frame)) cancelled = true;
          if (streamer && !cancelled) {
            const auto c2w_start = Clock::now();
            const auto samples =
                streamer->push(qwen3_omni::frames_to_codes({frame}, tc.num_code_groups));
            code2wav_ms += ms_since(c2w_start);
            emit_audio(samples);
          }
          return !cancelled;
        });
    const auto& frames = run.frames;
    result.audio_finish_reason = run.finish_reason;
    const double talker_total_ms = run.talker_ms;
    if (streamer && !cancelled) {
      const auto c2w_start = Clock::now();
      const auto samples = streamer->finish();
      code2wav_ms += ms_since(c2w_start);
      emit_audio(samples);
    }
    result.codes = qwen3_omni::frames_to_codes(frames, tc.num_code_groups);
    result.timings.talker_ms = talker_total_ms;
    result.timings.code_predictor_ms = run.code_predictor_ms;
    if (!frames.empty() && talker_total_ms > 0) {
      result.timings.talker_frames_per_s =
          static_cast<double>(frames.size()) / (talker_total_ms / 1000.0);
    }
    if (!frames.empty() && !cancelled) {
      const auto c2w_start = Clock::now();
      result.waveform = qwen3_omni::chunked_decode(code2wav, result.codes, kReferenceChunkFrames,
                                                   kReferenceLeftContext);
      // With streaming, the decode that counts for latency is the streamed one.
      if (!streamer) code2wav_ms += ms_since(c2w_start);
      result.timings.code2wav_ms = code2wav_ms;
      const double audio_s =
          static_cast<double>(result.waveform.numel()) / static_cast<double>(sample_rate());
      if (audio_s > 0) result.timings.code2wav_real_time_factor = code2wav_ms / 1000.0 / audio_s;
      if (!streamer) result.timings.time_to_first_audio_ms = ms_since(start);
    }
  }
  result.timings.total_ms = ms_since(start);
  return result;
}

}  // namespace omni::models
