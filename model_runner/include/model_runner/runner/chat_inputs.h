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
#include "model_runner/runner/conversation.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

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
