// The answers of /v1/chat/completions: the whole completion, the streamed chunks and their
// server-sent events.
#include <nlohmann/json.hpp>

#include <string>

#include "worker/http/openai_protocol.h"

namespace omni::http {
namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json reason_json(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(reason);
}

}  // namespace

std::string completion_json(const std::string& id, const std::string& model, int64_t created,
                            const std::optional<std::string>& text,
                            const std::optional<AudioOutput>& audio,
                            const std::string& finish_reason, const Usage& usage) {
  json choices = json::array();
  if (text) {
    choices.push_back({{"index", choices.size()},
                       {"message", {{"role", "assistant"}, {"content", *text}}},
                       {"logprobs", nullptr},
                       {"finish_reason", reason_json(finish_reason)}});
  }
  if (audio) {
    json audio_json = {{"id", audio->id},
                       {"data", audio->wav_base64},
                       {"expires_at", audio->expires_at},
                       {"transcript", audio->transcript}};
    choices.push_back(
        {{"index", choices.size()},
         {"message",
          {{"role", "assistant"}, {"content", nullptr}, {"audio", std::move(audio_json)}}},
         {"logprobs", nullptr},
         {"finish_reason", reason_json(finish_reason)}});
  }
  return dump({{"id", id},
               {"object", "chat.completion"},
               {"created", created},
               {"model", model},
               {"choices", std::move(choices)},
               {"usage", usage_json(usage)}});
}

std::string chunk_json(const std::string& id, const std::string& model, int64_t created,
                       const std::string& modality, const std::string& content, bool first,
                       const std::optional<std::string>& finish_reason) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (first || !content.empty()) delta["content"] = content;
  json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  return dump({{"id", id},
               {"object", "chat.completion.chunk"},
               {"created", created},
               {"model", model},
               {"modality", modality},
               {"choices", json::array({std::move(choice)})}});
}

std::string usage_chunk_json(const std::string& id, const std::string& model, int64_t created,
                             const Usage& usage) {
  return dump({{"id", id},
               {"object", "chat.completion.chunk"},
               {"created", created},
               {"model", model},
               {"choices", json::array()},
               {"usage", usage_json(usage)}});
}

std::string sse_event(const std::string& json) { return "data: " + json + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace omni::http
