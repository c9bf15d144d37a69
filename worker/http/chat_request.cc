#include "worker/http/chat_request.h"

#include <string>

namespace omni::http {

void to_conversation(const ChatCompletionRequest& r, models::ChatRequest& chat,
                     std::vector<pipeline::MediaFile>& media) {
  chat.text = r.text;
  chat.system_prompt = r.system_prompt;
  for (const auto& t : r.history) {
    chat.history.push_back({t.role, t.text, t.audio_count, t.image_count});
  }
  // The name keeps the format: the decoders report formats by name.
  for (size_t i = 0; i < r.audio.size(); ++i) {
    media.push_back(
        {"audio", "input-" + std::to_string(i) + "." + r.audio[i].format, r.audio[i].data});
  }
  for (size_t i = 0; i < r.images.size(); ++i) {
    media.push_back(
        {"image", "input-" + std::to_string(i) + "." + r.images[i].format, r.images[i].data});
  }
}

}  // namespace omni::http
