// A chat (system prompt, earlier turns, the user turn with its audio and image files) -> the
// thinker's inputs: Qwen's chat template (ChatML: "<|im_start|>ROLE\nTEXT<|im_end|>\n" a turn,
// a user turn's audio, then images, then text) with the audio / image placeholders expanded to
// the number of tokens each input makes, Whisper features and vision patches with the
// checkpoint's processor settings. Text is never read as control tokens.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model_runner/preprocess/audio.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// A turn of the conversation before the one to answer.
struct ChatTurn {
  std::string role;  // "system", "user" or "assistant"
  std::string text;
  // A user turn's media: the next audio_count of ChatRequest::audio_files and image_count of
  // ::image_files (earlier turns' media come first in those lists).
  size_t audio_count = 0, image_count = 0;
};

// A chat: the system prompt, the earlier turns, and the user turn to answer.
struct ChatRequest {
  std::string text;                      // the user turn to answer
  std::vector<std::string> audio_files;  // WAV / FLAC / OGG, any sample rate (resampled)
  std::vector<std::string> image_files;  // PNG / JPEG
  std::string system_prompt;             // empty: no system turn
  std::vector<ChatTurn> history;
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
