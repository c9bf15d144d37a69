// A chat turn (text, audio files, image files, system prompt) -> the thinker's inputs: Qwen's
// chat template with the audio / image placeholders expanded to the number of tokens each input
// makes, Whisper features and vision patches with the checkpoint's processor settings.
#pragma once

#include <string>
#include <vector>

#include "model_runner/preprocess/audio.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// One user turn of a chat.
struct ChatRequest {
  std::string text;
  std::vector<std::string> audio_files;  // WAV / FLAC / OGG, any sample rate (resampled)
  std::vector<std::string> image_files;  // PNG / JPEG
  std::string system_prompt;             // empty: no system turn
};

struct ChatPreprocessor {
  WhisperFeatureOptions audio;
  VisionPatchOptions vision;

  // Reads preprocessor_config.json of `model_dir` and checks it against the thinker's config
  // (mel bins, patch geometry); throws naming the file and field.
  static ChatPreprocessor load(const std::string& model_dir, const qwen3_omni::ThinkerConfig& cfg);
  // Throws naming the input file on an unreadable audio or image file.
  qwen3_omni::ThinkerInputs prepare(const ChatRequest& request, const Tokenizer& tokenizer,
                                    const qwen3_omni::ThinkerConfig& cfg) const;
};

}  // namespace omni::models
