#include "model_runner/runner/chat_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models {

using qwen3_omni::ThinkerInputs;

namespace {

// The prompt as the chat template's control tokens and the text between them. Text is encoded
// with special tokens off: a user who types "<|im_start|>system" gets those characters, not a
// system turn. Text between two control tokens is encoded as one piece, as Hugging Face encodes
// the text between special tokens, so prompts without such strings get the same ids.
class PromptBuilder {
 public:
  // `context`: the model's context in tokens, which the prompt must stay below; 0: no limit.
  PromptBuilder(const Tokenizer& tokenizer, int64_t context)
      : tokenizer_(tokenizer), context_(context) {}
  void control(const std::string& token) {
    flush();
    ids_.push_back(tokenizer_.token_id(token));
  }
  void text(const std::string& text) { pending_ += text; }
  std::vector<int64_t> ids() {
    flush();
    return std::move(ids_);
  }

 private:
  // The text is encoded with the tokens left in the context as its limit, so that a huge text
  // is refused for about the cost of the context, not of the text.
  void flush() {
    if (pending_.empty()) return;
    std::optional<size_t> left;
    if (context_ > 0) {
      const auto most = static_cast<size_t>(context_ - 1);
      if (ids_.size() > most) too_long(0);
      left = most - ids_.size();
    }
    try {
      for (int32_t id : tokenizer_.encode(pending_, /*allow_special=*/false, left)) {
        ids_.push_back(id);
      }
    } catch (const TokenLimitError& e) {
      too_long(e.encoded());
    }
    pending_.clear();
  }
  // Worded as TokenSequence words a prompt that is too long, which it would be.
  [[noreturn]] void too_long(size_t encoded) const {
    throw TokenLimitError(detail::str_cat("the prompt (", context_,
                                          " tokens or more) does not fit the model's context of ",
                                          context_, " tokens"),
                          static_cast<size_t>(context_ - 1), ids_.size() + encoded);
  }
  const Tokenizer& tokenizer_;
  const int64_t context_;
  std::vector<int64_t> ids_;
  std::string pending_;
};

}  // namespace

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
  PromptBuilder prompt(tokenizer, cfg.text.max_position_embeddings);
  // Audio whose tokens alone would overflow the context is refused before it is decoded: a
  // full chunk of 2 * n_window mel frames makes audio_output_length(chunk) tokens.
  AudioLimits limits;
  if (cfg.text.max_position_embeddings > 0) {
    const int64_t chunk = 2 * cfg.audio.n_window;
    const double chunk_seconds =
        static_cast<double>(chunk * audio.hop_length) / static_cast<double>(audio.sampling_rate);
    const int64_t chunks = cfg.text.max_position_embeddings /
                           qwen3_omni::audio_output_length(chunk, cfg.audio.n_window);
    limits.max_seconds = static_cast<double>(chunks + 1) * chunk_seconds;
  }
  std::vector<at::Tensor> features, patches;
  size_t next_audio = 0, next_image = 0;
  // The request's next audio file or image: its placeholders in the prompt, its features or
  // patches in order.
  const auto next_media = [&](ChatPart::Kind kind) {
    const bool is_audio = kind == ChatPart::Kind::kAudio;
    OMNI_CHECK(is_audio ? next_audio < request.audio_files.size()
                        : next_image < request.image_files.size(),
               "the chat's turns name more ", is_audio ? "audio inputs" : "images",
               " than it has (", request.audio_files.size(), " audio, ", request.image_files.size(),
               " images)");
    if (is_audio) {
      const ChatMedia& file = request.audio_files[next_audio++];
      const auto clip = file.path.empty()
                            ? decode_audio(reinterpret_cast<const uint8_t*>(file.data.data()),
                                           file.data.size(), file.name, limits)
                            : read_audio_file(file.path, limits);
      const auto mel = whisper_log_mel(resample_audio(clip, audio.sampling_rate), audio);
      const int64_t frames = mel.size(1);
      OMNI_CHECK(frames > 0, file.path.empty() ? file.name : file.path,
                 ": the audio is shorter than one feature frame");
      in.audio_lengths.push_back(frames);
      features.push_back(mel);
      const int64_t tokens = qwen3_omni::audio_output_length(frames, cfg.audio.n_window);
      prompt.control("<|audio_start|>");
      for (int64_t i = 0; i < tokens; ++i) prompt.control("<|audio_pad|>");
      prompt.control("<|audio_end|>");
      return;
    }
    const ChatMedia& file = request.image_files[next_image++];
    auto p = image_to_patches(file.path.empty()
                                  ? decode_image(reinterpret_cast<const uint8_t*>(file.data.data()),
                                                 file.data.size(), file.name)
                                  : read_image_file(file.path),
                              vision);
    const auto [t, h, w] = p.grid_thw;
    const int64_t tokens = t * h * w / (vision.merge_size * vision.merge_size);
    in.image_grids.push_back(p.grid_thw);
    patches.push_back(p.pixel_values);
    prompt.control("<|vision_start|>");
    for (int64_t i = 0; i < tokens; ++i) prompt.control("<|image_pad|>");
    prompt.control("<|vision_end|>");
  };
  const auto content = [&](const std::vector<ChatPart>& parts) {
    for (const ChatPart& part : parts) {
      if (part.kind == ChatPart::Kind::kText) {
        prompt.text(part.text);
      } else {
        next_media(part.kind);
      }
    }
  };
  const auto turn = [&](const std::string& role, const std::function<void()>& body) {
    prompt.control("<|im_start|>");
    prompt.text(role + "\n");
    body();
    prompt.control("<|im_end|>");
    prompt.text("\n");
  };
  if (!request.system_prompt.empty()) {
    turn("system", [&] { prompt.text(request.system_prompt); });
  }
  for (const auto& t : request.history) {
    OMNI_CHECK(t.role == "system" || t.role == "user" || t.role == "assistant",
               "unknown chat role '", t.role, "' (system, user, assistant)");
    OMNI_CHECK(t.role == "user" ||
                   std::all_of(t.parts.begin(), t.parts.end(),
                               [](const ChatPart& p) { return p.kind == ChatPart::Kind::kText; }),
               "a ", t.role, " turn cannot hold media");
    turn(t.role, [&] { content(t.parts); });
  }
  // The turn to answer: its parts, or the media no earlier turn took and then its text.
  turn("user", [&] {
    if (!request.parts.empty()) {
      content(request.parts);
      return;
    }
    while (next_audio < request.audio_files.size()) next_media(ChatPart::Kind::kAudio);
    while (next_image < request.image_files.size()) next_media(ChatPart::Kind::kImage);
    prompt.text(request.text);
  });
  OMNI_CHECK(next_audio == request.audio_files.size() && next_image == request.image_files.size(),
             "the chat has ", request.audio_files.size(), " audio inputs and ",
             request.image_files.size(), " images but its turns name ", next_audio, " and ",
             next_image);
  prompt.control("<|im_start|>");
  prompt.text("assistant\n");
  in.input_ids = prompt.ids();
  if (!features.empty()) in.audio_features = at::cat(features, 1);
  if (!patches.empty()) in.pixel_values = at::cat(patches, 0);

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
