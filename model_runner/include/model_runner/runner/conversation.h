// A conversation as a request carries it, whatever model answers it: the system prompt, the
// earlier turns, and the user turn to answer with its parts (text, audio and image files) in
// order.
#pragma once

#include <string>
#include <utility>
#include <vector>

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
  static ChatMedia in_memory(std::string name, std::string bytes) {
    ChatMedia m("");
    m.name = std::move(name);
    m.data = std::move(bytes);
    return m;
  }
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

}  // namespace omni::models
