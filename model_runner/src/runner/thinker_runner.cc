#include "model_runner/runner/thinker_runner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"

namespace omni::models {

using qwen3_omni::Thinker;
using qwen3_omni::ThinkerInputs;

std::vector<std::string> thinker_component_paths(const std::vector<std::string>& names) {
  std::vector<std::string> paths;
  for (std::string name : names) {
    OMNI_CHECK(!name.empty(), "cpu_offload_components: an entry is empty");
    if (name.rfind("thinker.", 0) == 0) name = name.substr(8);
    if (name == "language_model" || name.rfind("language_model.", 0) == 0) {
      name = "model" + name.substr(14);
    }
    paths.push_back(name);
  }
  return paths;
}

std::unique_ptr<ThinkerRunner> ThinkerRunner::load(
    const ThinkerRunnerOptions& options, std::shared_ptr<offload::TransferEngine> engine) {
  namespace fs = std::filesystem;
  OMNI_CHECK(engine != nullptr, "ThinkerRunner::load needs a transfer engine");
  OMNI_CHECK(fs::is_directory(options.model_dir), "model directory ", options.model_dir,
             " does not exist or is not a directory");
  std::unique_ptr<ThinkerRunner> r(new ThinkerRunner());
  r->options_ = options;
  r->engine_ = engine;

  const auto config = HfConfig::load(options.model_dir);
  const auto cfg = qwen3_omni::parse_thinker_config(config);
  const auto checkpoint = SafetensorsCheckpoint::open(options.model_dir);
  r->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(options.model_dir));
  r->audio_options_ = whisper_options_from_preprocessor_config(options.model_dir);
  OMNI_CHECK(r->audio_options_.feature_size == cfg.audio.num_mel_bins, options.model_dir,
             "/preprocessor_config.json: feature_size ", r->audio_options_.feature_size,
             " differs from the audio tower's num_mel_bins ", cfg.audio.num_mel_bins);
  // Pixel bounds, mean and std from preprocessor_config.json; the patch geometry must agree
  // with the vision encoder (the processor's defaults follow the encoder's config).
  VisionPatchOptions vision_defaults;
  vision_defaults.patch_size = cfg.vision.patch_size;
  vision_defaults.temporal_patch_size = cfg.vision.temporal_patch_size;
  vision_defaults.merge_size = cfg.vision.spatial_merge_size;
  r->vision_options_ = vision_options_from_preprocessor_config(options.model_dir, vision_defaults);
  OMNI_CHECK(r->vision_options_.patch_size == cfg.vision.patch_size &&
                 r->vision_options_.temporal_patch_size == cfg.vision.temporal_patch_size &&
                 r->vision_options_.merge_size == cfg.vision.spatial_merge_size,
             options.model_dir, "/preprocessor_config.json: patch_size / temporal_patch_size / ",
             "merge_size (", r->vision_options_.patch_size, " / ",
             r->vision_options_.temporal_patch_size, " / ", r->vision_options_.merge_size,
             ") differ from the vision encoder's config.json (", cfg.vision.patch_size, " / ",
             cfg.vision.temporal_patch_size, " / ", cfg.vision.spatial_merge_size, ")");

  r->thinker_ = std::make_shared<Thinker>(cfg, options.dtype);
  const auto report = load_weights(*r->thinker_, checkpoint, cfg.weight_prefix);
  omni::log_info("loaded ", report.tensors, " tensors (", report.bytes, " bytes) from ",
                 options.model_dir, report.converted ? " with dtype conversion" : "");
  for (const auto& child : r->thinker_->named_children()) {
    int64_t bytes = 0;
    for (const auto& p : child.value()->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    r->module_bytes_[child.key()] = bytes;
  }

  // Offload after the weights are bound: the backend moves them into its stores.
  offload::OffloadConfig oc;
  offload::ModelSpec spec;
  const auto& o = options.offload;
  oc.pin_memory = o.pin_memory;
  if (o.layerwise) {
    oc.layerwise = true;
    oc.num_gpu_layers = o.num_gpu_layers;
    spec.dits = {"model"};
    spec.block_lists = {{"model.layers", {}}};
    if (o.layerwise_encoders) {
      spec.dits.insert(spec.dits.end(), {"audio_tower", "visual"});
      spec.block_lists.push_back({"audio_tower.layers", {}});
      spec.block_lists.push_back({"visual.blocks", {}});
    }
  } else if (o.cpu_offload_enabled) {
    oc.component = true;
    oc.components = thinker_component_paths(o.components);
    oc.component_policy = offload::parse_component_policy(o.strategy);
    oc.device_budget_bytes = o.device_budget_bytes;
    oc.device_budget_fraction = o.device_budget_fraction;
  }
  oc.validate();
  r->backend_ = offload::apply_offload(*r->thinker_, spec, oc, engine);
  r->thinker_->set_device(engine->compute_device());

  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = r->tokenizer_->find_token(name)) r->stop_tokens_.push_back(*id);
  }
  return r;
}

ThinkerInputs ThinkerRunner::prepare(const ChatRequest& request) const {
  const auto& cfg = thinker_->config();
  ThinkerInputs in;
  std::string user;
  std::vector<at::Tensor> features;
  for (const auto& path : request.audio_files) {
    const auto mel = whisper_log_mel(
        resample_audio(read_audio_file(path), audio_options_.sampling_rate), audio_options_);
    const int64_t frames = mel.size(1);
    OMNI_CHECK(frames > 0, path, ": the audio is shorter than one feature frame");
    in.audio_lengths.push_back(frames);
    features.push_back(mel);
    const int64_t tokens = qwen3_omni::audio_output_length(frames, cfg.audio.n_window);
    user += "<|audio_start|>";
    for (int64_t i = 0; i < tokens; ++i) user += "<|audio_pad|>";
    user += "<|audio_end|>";
  }
  std::vector<at::Tensor> patches;
  for (const auto& path : request.image_files) {
    auto p = image_to_patches(read_image_file(path), vision_options_);
    const auto [t, h, w] = p.grid_thw;
    const int64_t tokens = t * h * w / (vision_options_.merge_size * vision_options_.merge_size);
    in.image_grids.push_back(p.grid_thw);
    patches.push_back(p.pixel_values);
    user += "<|vision_start|>";
    for (int64_t i = 0; i < tokens; ++i) user += "<|image_pad|>";
    user += "<|vision_end|>";
  }
  user += request.text;
  if (!features.empty()) in.audio_features = at::cat(features, 1);
  if (!patches.empty()) in.pixel_values = at::cat(patches, 0);

  // Qwen chat template: a system turn when given, the user turn, the assistant's opening.
  std::string prompt;
  if (!request.system_prompt.empty()) {
    prompt += "<|im_start|>system\n" + request.system_prompt + "<|im_end|>\n";
  }
  prompt += "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  for (int32_t id : tokenizer_->encode(prompt)) in.input_ids.push_back(id);
  const auto count = [&](int64_t token) {
    return std::count(in.input_ids.begin(), in.input_ids.end(), token);
  };
  OMNI_CHECK(request.audio_files.empty() || count(cfg.audio_token_id) > 0, tokenizer_->source(),
             ": <|audio_pad|> does not encode to the config's audio_token_id ", cfg.audio_token_id);
  OMNI_CHECK(request.image_files.empty() || count(cfg.image_token_id) > 0, tokenizer_->source(),
             ": <|image_pad|> does not encode to the config's image_token_id ", cfg.image_token_id);
  return in;
}

GenerationResult ThinkerRunner::generate(const ThinkerInputs& inputs, SamplingParams params,
                                         const OnTokenFn& on_token) {
  if (params.stop_token_ids.empty()) params.stop_token_ids = stop_tokens_;
  at::NoGradGuard no_grad;
  auto state = thinker_->new_state();
  at::Tensor first = thinker_->prefill(inputs, state)[0];
  return generate_tokens(
      [&](int64_t step, const std::vector<int64_t>& generated) -> at::Tensor {
        if (step == 0) return first;
        return thinker_->decode(generated.back(), state);
      },
      params, on_token);
}

at::Tensor ThinkerRunner::prompt_logits(const ThinkerInputs& inputs) {
  at::NoGradGuard no_grad;
  auto state = thinker_->new_state();
  return thinker_->prefill(inputs, state, /*all_logits=*/true);
}

int64_t ThinkerRunner::module_bytes(const std::string& path) const {
  auto it = module_bytes_.find(path);
  OMNI_CHECK(it != module_bytes_.end(), "the thinker has no part named ", path);
  return it->second;
}

}  // namespace omni::models
