// A chat (system prompt, earlier turns, the user turn with its audio and image files) -> the
// thinker's inputs: Qwen's chat template (ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" a turn,
// its parts in their order, as Hugging Face's template renders them) with the audio / image
// placeholders expanded to the number of tokens each input makes, Whisper features and vision
// patches with the checkpoint's processor settings. Text is never read as control tokens.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model_runner/preprocess/audio.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// A piece of a turn, in the order the turn gives it: text, or the request's next audio or image
// file (earlier turns' media come first in ChatRequest's lists).
struct ChatPart {
  enum class Kind { kText, kAudio, kImage };
  Kind kind = Kind::kText;
  std::string text;  // kText
};

// A turn of the conversation before the one to answer.
struct ChatTurn {
  std::string role;  // "system", "user" or "assistant"
  std::vector<ChatPart> parts;
};

// An input of the chat: a file by its path, or a file's bytes already in memory (an upload; no
// temporary file) with the name its errors give it.
struct ChatMedia {
  ChatMedia(std::string file) : path(std::move(file)) {}  // NOLINT(google-explicit-constructor)
  static ChatMedia in_memory(std::string name, std::string bytes);
  std::string path;  // empty: in memory
  std::string name;  // in memory: e.g. "input-0.wav"
  std::string data;  // in memory: the bytes
  bool operator==(const ChatMedia& o) const {
    return path == o.path && name == o.name && data == o.data;
  }
};

// A chat: the system prompt, the earlier turns, and the user turn to answer.
struct ChatRequest {
  std::string text;                    // the user turn to answer (when `parts` is empty)
  std::vector<ChatMedia> audio_files;  // WAV / FLAC / OGG, any sample rate (resampled)
  std::vector<ChatMedia> image_files;  // PNG / JPEG
  std::string system_prompt;           // empty: no system turn
  std::vector<ChatTurn> history;
  // The turn to answer as parts in order (an API request's content); empty: the media no earlier
  // turn took (audio, then images), then `text` (the command line's --audio/--image/--prompt).
  std::vector<ChatPart> parts;
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
