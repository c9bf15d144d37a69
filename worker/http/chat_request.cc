#include "worker/http/chat_request.h"

#include <string>

namespace omni::http {

void to_conversation(const ChatCompletionRequest& r, models::ChatRequest& chat,
                     std::vector<pipeline::MediaFile>& media) {
  chat.system_prompt = r.system_prompt;
  const auto parts = [](const std::vector<ContentPart>& from) {
    std::vector<models::ChatPart> to;
    for (const auto& p : from) {
      to.push_back({p.kind == ContentPart::Kind::kText    ? models::ChatPart::Kind::kText
                    : p.kind == ContentPart::Kind::kAudio ? models::ChatPart::Kind::kAudio
                                                          : models::ChatPart::Kind::kImage,
                    p.text});
    }
    return to;
  };
  for (const auto& t : r.history) chat.history.push_back({t.role, parts(t.parts)});
  chat.parts = parts(r.parts);
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
