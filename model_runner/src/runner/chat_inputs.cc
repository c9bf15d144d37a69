#include "model_runner/runner/chat_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpu_offload/check.h"

namespace omni::models {

using qwen3_omni::ThinkerInputs;

ChatPreprocessor ChatPreprocessor::load(const std::string& model_dir,
                                        const qwen3_omni::ThinkerConfig& cfg) {
  ChatPreprocessor p;
  p.audio = whisper_options_from_preprocessor_config(model_dir);
  OMNI_CHECK(p.audio.feature_size == cfg.audio.num_mel_bins, model_dir,
             "/preprocessor_config.json: feature_size ", p.audio.feature_size,
             " differs from the audio tower's num_mel_bins ", cfg.audio.num_mel_bins);
  // Pixel bounds, mean and std from preprocessor_config.json; the patch geometry must agree
  // with the vision encoder (the processor's defaults follow the encoder's config).
  VisionPatchOptions vision_defaults;
  vision_defaults.patch_size = cfg.vision.patch_size;
  vision_defaults.temporal_patch_size = cfg.vision.temporal_patch_size;
  vision_defaults.merge_size = cfg.vision.spatial_merge_size;
  p.vision = vision_options_from_preprocessor_config(model_dir, vision_defaults);
  OMNI_CHECK(p.vision.patch_size == cfg.vision.patch_size &&
                 p.vision.temporal_patch_size == cfg.vision.temporal_patch_size &&
                 p.vision.merge_size == cfg.vision.spatial_merge_size,
             model_dir, "/preprocessor_config.json: patch_size / temporal_patch_size / ",
             "merge_size (", p.vision.patch_size, " / ", p.vision.temporal_patch_size, " / ",
             p.vision.merge_size, ") differ from the vision encoder's config.json (",
             cfg.vision.patch_size, " / ", cfg.vision.temporal_patch_size, " / ",
             cfg.vision.spatial_merge_size, ")");

  return p;
}

ThinkerInputs ChatPreprocessor::prepare(const ChatRequest& request, const Tokenizer& tokenizer,
                                        const qwen3_omni::ThinkerConfig& cfg) const {
  ThinkerInputs in;
  std::string user;
  std::vector<at::Tensor> features;
  for (const auto& path : request.audio_files) {
    const auto mel =
        whisper_log_mel(resample_audio(read_audio_file(path), audio.sampling_rate), audio);
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
    auto p = image_to_patches(read_image_file(path), vision);
    const auto [t, h, w] = p.grid_thw;
    const int64_t tokens = t * h * w / (vision.merge_size * vision.merge_size);
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
  for (int32_t id : tokenizer.encode(prompt)) in.input_ids.push_back(id);
  const auto count = [&](int64_t token) {
    return std::count(in.input_ids.begin(), in.input_ids.end(), token);
  };
  OMNI_CHECK(request.audio_files.empty() || count(cfg.audio_token_id) > 0, tokenizer.source(),
             ": <|audio_pad|> does not encode to the config's audio_token_id ", cfg.audio_token_id);
  OMNI_CHECK(request.image_files.empty() || count(cfg.image_token_id) > 0, tokenizer.source(),
             ": <|image_pad|> does not encode to the config's image_token_id ", cfg.image_token_id);
  return in;
}

}  // namespace omni::models
