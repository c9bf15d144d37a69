#include "model_runner/runner/speech_runners.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"
#include "cpu_offload/logging.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

HfConfig load_speech_config(const std::string& model_dir, const char* part) {
  namespace fs = std::filesystem;
  OMNI_CHECK(fs::is_directory(model_dir), "model directory ", model_dir,
             " does not exist or is not a directory");
  auto config = HfConfig::load(model_dir);
  OMNI_CHECK(qwen3_omni::has_speech_output(config), config.source(), " has no ", part,
             " (enable_audio_output is false or the checkpoint is thinker-only): a ", part,
             " stage cannot run it");
  qwen3_omni::check_speech_configs(config);
  return config;
}

}  // namespace

std::vector<std::string> talker_stage_component_paths(const std::vector<std::string>& names) {
  std::vector<std::string> paths;
  for (const auto& name : names) {
    OMNI_CHECK(!name.empty(), "cpu_offload_components: an entry is empty");
    if (starts_with(name, "talker.")) {
      paths.push_back(name.substr(7));
    } else if (name == "code_predictor" || starts_with(name, "code_predictor.") ||
               starts_with(name, "model.layers")) {
      paths.push_back(name);
    }
  }
  return paths;
}

std::vector<std::string> thinker_stage_component_names(const std::vector<std::string>& names) {
  static const std::vector<std::string> kParts = {"visual", "audio_tower", "language_model",
                                                  "model", "lm_head"};
  std::vector<std::string> out;
  for (const auto& name : names) {
    if (starts_with(name, "thinker.")) {
      out.push_back(name);
      continue;
    }
    const auto head = name.substr(0, name.find('.'));
    if (std::find(kParts.begin(), kParts.end(), head) != kParts.end()) out.push_back(name);
  }
  return out;
}

void check_component_names(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    OMNI_CHECK(!name.empty(), "cpu_offload_components: an entry is empty");
    const bool known = name == "thinker" || name == "talker" || name == "code2wav" ||
                       !thinker_stage_component_names({name}).empty() ||
                       !talker_stage_component_paths({name}).empty();
    OMNI_CHECK(known, "cpu_offload_components: no part of the model is called '", name,
               "' (the stages thinker, talker, code2wav; the thinker's visual, audio_tower, "
               "language_model, lm_head; the talker's code_predictor; thinker.*, talker.*, "
               "language_model.layers.*, talker.model.layers.*)");
  }
}

// ---------------------------------------------------------------------------- talker

TalkerRunner::~TalkerRunner() = default;

std::unique_ptr<TalkerRunner> TalkerRunner::load(const SpeechRunnerOptions& options,
                                                 std::shared_ptr<offload::TransferEngine> engine) {
  OMNI_CHECK(engine != nullptr, "TalkerRunner::load needs a transfer engine");
  const auto config = load_speech_config(options.model_dir, "talker");
  std::unique_ptr<TalkerRunner> r(new TalkerRunner());
  r->engine_ = std::move(engine);
  r->thinker_cfg_ = qwen3_omni::parse_thinker_config(config);
  r->cfg_ = qwen3_omni::parse_talker_config(config, r->thinker_cfg_);
  r->ids_ = qwen3_omni::parse_omni_token_ids(config, r->thinker_cfg_);
  const auto checkpoint = SafetensorsCheckpoint::open(options.model_dir);
  r->talker_ = std::make_shared<qwen3_omni::Talker>(
      r->cfg_, resolve_dtype(options.dtype, checkpoint, "talker."));
  const auto report = load_weights(*r->talker_, checkpoint, "talker.", /*defer_conversion=*/true);
  log_info("loaded ", report.tensors, " talker tensors (", report.bytes, " bytes) from ",
           options.model_dir);

  offload::OffloadConfig oc;
  offload::ModelSpec spec;
  const auto& o = options.offload;
  oc.pin_memory = o.pin_memory;
  if (o.layerwise) {
    oc.layerwise = true;
    oc.num_gpu_layers = o.num_gpu_layers;
    spec.dits = {"model"};
    spec.block_lists = {{"model.layers", {}}};
  } else if (o.cpu_offload_enabled) {
    oc.components = talker_stage_component_paths(o.components);
    if (!oc.components.empty()) {
      oc.component = true;
      oc.component_policy = offload::parse_component_policy(o.strategy);
      oc.device_budget_bytes = o.device_budget_bytes;
      oc.device_budget_fraction = o.device_budget_fraction;
    }
  }
  defer_conversions(report, "", oc.convert_dtypes);
  oc.validate();
  offload::LoadProgress progress("placing the talker weights of " + options.model_dir,
                                 offload::module_tensor_bytes(*r->talker_));
  r->backend_ = offload::apply_offload(*r->talker_, spec, oc, r->engine_);
  r->talker_->set_device(r->engine_->compute_device());
  return r;
}

std::vector<int64_t> TalkerRunner::tts_token_ids() const {
  return {ids_.tts_bos, ids_.tts_eos, ids_.tts_pad};
}

std::vector<std::string> TalkerRunner::speakers() const {
  std::vector<std::string> names;
  for (const auto& [name, id] : cfg_.speakers) names.push_back(name);
  return names;
}

std::string TalkerRunner::default_speaker() const {
  const auto names = speakers();
  if (names.empty()) return "";
  return std::find(names.begin(), names.end(), "ethan") != names.end() ? "ethan" : names.front();
}

void TalkerRunner::StreamingHandoff::append_rows(const at::Tensor& embeds,
                                                 const at::Tensor& hidden) {
  OMNI_CHECK(embeds.dim() == 2 && hidden.sizes() == embeds.sizes(),
             "thinker -> talker hand-off: embeds and hidden rows must have the same [k, hidden] "
             "shape, got ",
             embeds.sizes(), " and ", hidden.sizes());
  const int64_t k = embeds.size(0);
  if (!embeds_storage_.defined() || rows_ + k > embeds_storage_.size(0)) {
    const int64_t capacity = std::max<int64_t>(2 * (rows_ + k), 64);
    auto grow = [&](const at::Tensor& old, const at::Tensor& like) {
      // A normal tensor even under InferenceMode: the rows after it are written in place,
      // possibly by a caller outside it.
      c10::InferenceMode normal_tensor(false);
      auto fresh = at::empty({capacity, like.size(1)}, like.options());
      if (rows_ > 0) fresh.narrow(0, 0, rows_).copy_(old.narrow(0, 0, rows_));
      return fresh;
    };
    embeds_storage_ = grow(embeds_storage_, embeds);
    hidden_storage_ = grow(hidden_storage_, hidden);
  }
  embeds_storage_.narrow(0, rows_, k).copy_(embeds);
  hidden_storage_.narrow(0, rows_, k).copy_(hidden);
  rows_ += k;
  handoff.embeds = embeds_storage_.narrow(0, 0, rows_);
  handoff.hidden = hidden_storage_.narrow(0, 0, rows_);
}

// ---------------------------------------------------------------------------- code2wav

Code2WavRunner::~Code2WavRunner() = default;

std::unique_ptr<Code2WavRunner> Code2WavRunner::load(
    const SpeechRunnerOptions& options, std::shared_ptr<offload::TransferEngine> engine) {
  OMNI_CHECK(engine != nullptr, "Code2WavRunner::load needs a transfer engine");
  const auto config = load_speech_config(options.model_dir, "code2wav");
  std::unique_ptr<Code2WavRunner> r(new Code2WavRunner());
  r->engine_ = std::move(engine);
  r->cfg_ = qwen3_omni::parse_code2wav_config(config);
  const auto checkpoint = SafetensorsCheckpoint::open(options.model_dir);
  r->code2wav_ = std::make_shared<qwen3_omni::Code2Wav>(
      r->cfg_, resolve_dtype(options.dtype, checkpoint, "code2wav."));
  const auto report =
      load_weights(*r->code2wav_, checkpoint, "code2wav.", /*defer_conversion=*/true);
  log_info("loaded ", report.tensors, " code2wav tensors (", report.bytes, " bytes) from ",
           options.model_dir);
  r->root_ = std::make_shared<torch::nn::Module>("Code2WavStage");
  r->root_->register_module("code2wav", r->code2wav_);
  const auto& o = options.offload;
  offload::OffloadConfig oc;
  oc.pin_memory = o.pin_memory;
  const bool whole =
      std::find(o.components.begin(), o.components.end(), "code2wav") != o.components.end();
  if (o.cpu_offload_enabled && whole) {
    oc.component = true;
    oc.components = {"code2wav"};
    oc.component_policy = offload::parse_component_policy(o.strategy);
    oc.device_budget_bytes = o.device_budget_bytes;
    oc.device_budget_fraction = o.device_budget_fraction;
  }
  defer_conversions(report, "code2wav.", oc.convert_dtypes);
  oc.validate();
  offload::LoadProgress progress("placing the code2wav weights of " + options.model_dir,
                                 offload::module_tensor_bytes(*r->root_));
  r->backend_ = offload::apply_offload(*r->root_, offload::ModelSpec{}, oc, r->engine_);
  return r;
}

}  // namespace omni::models
