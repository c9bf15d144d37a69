#include "worker/http/openai_protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "worker/http/ascii_text.h"
#include "worker/http/media_reader.h"
#include "worker/http/request_json.h"

namespace omni::http {
namespace {

using detail::check_keys;
using detail::fail;
using detail::field;
using detail::get_bool;
using detail::get_int;
using detail::get_number;
using detail::get_seed;
using detail::get_string;
using detail::index_path;
using detail::invalid_value;
using detail::join_path;
using detail::MediaReader;
using detail::parse_body;
using detail::quote_value;
using detail::unsupported;
using detail::wrong_type;
using nlohmann::json;

// --- messages -----------------------------------------------------------------------------

// A text part's text ({"type": "text", "text": ...}).
const std::string& text_part(const json& part, const std::string& path) {
  check_keys(part, path, {"type", "text"});
  const json* text = field(part, "text");
  if (text == nullptr)
    fail(join_path(path, "text"), "'" + path + ".text' is required", "missing_field");
  return get_string(*text, join_path(path, "text"));
}

// The part's "type", checked to be a string.
const std::string& part_type(const json& part, const std::string& path) {
  if (!part.is_object()) wrong_type(path, "an object (a content part)", part);
  const json* type = field(part, "type");
  if (type == nullptr)
    fail(join_path(path, "type"), "'" + path + ".type' is required", "missing_field");
  return get_string(*type, join_path(path, "type"));
}

// Content part types of the OpenAI API (or of vLLM) that this server does not take.
bool is_known_unsupported_part(const std::string& type) {
  for (const char* t : {"video_url", "file", "input_file", "image_file", "refusal", "input_image",
                        "input_text", "image", "audio", "video"}) {
    if (type == t) return true;
  }
  return false;
}

// A message's content: a string (one text part), or parts; other than text, only a user turn's
// media parts are taken (appended to out.audio and out.images).
std::vector<ContentPart> read_content(const json& content, const std::string& path,
                                      const std::string& role, MediaReader& media,
                                      ChatCompletionRequest& out) {
  if (content.is_string()) return {{ContentPart::Kind::kText, content.get<std::string>()}};
  if (!content.is_array()) wrong_type(path, "a string or an array of content parts", content);
  std::vector<ContentPart> parts;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_path = index_path(path, j);
    const json& part = content[j];
    const std::string& type = part_type(part, part_path);
    if (type == "text") {
      parts.push_back({ContentPart::Kind::kText, text_part(part, part_path)});
      continue;
    }
    if (role != "user") {
      std::string why = part_path;
      why += role == "assistant" ? ": assistant turns" : ": system and developer messages";
      why += " hold text parts only, got ";
      why += quote_value(type);
      unsupported(join_path(part_path, "type"), why);
    }
    if (type == "image_url") {
      check_keys(part, part_path, {"type", "image_url"});
      out.images.push_back(media.image_url(part, part_path));
      parts.push_back({ContentPart::Kind::kImage, ""});
    } else if (type == "input_audio") {
      check_keys(part, part_path, {"type", "input_audio"});
      out.audio.push_back(media.input_audio(part, part_path));
      parts.push_back({ContentPart::Kind::kAudio, ""});
    } else if (type == "audio_url") {
      check_keys(part, part_path, {"type", "audio_url"});
      out.audio.push_back(media.audio_url(part, part_path));
      parts.push_back({ContentPart::Kind::kAudio, ""});
    } else if (is_known_unsupported_part(type)) {
      unsupported(join_path(part_path, "type"),
                  part_path + ": content parts of type " + quote_value(type) +
                      " are not supported (text, image_url, input_audio, audio_url)");
    } else {
      invalid_value(join_path(part_path, "type"), "unknown content part type " + quote_value(type) +
                                                      " (text, image_url, input_audio, audio_url)");
    }
  }
  return parts;
}

void read_messages(const json& root, const ParseLimits& limits, ChatCompletionRequest& out) {
  const json* messages = field(root, "messages");
  if (messages == nullptr) fail("messages", "'messages' is required", "missing_field");
  if (!messages->is_array()) wrong_type("messages", "an array of messages", *messages);
  if (messages->empty()) invalid_value("messages", "at least one message is required");
  if (messages->size() > limits.max_messages) {
    throw ApiException(request_too_large("'messages' holds " + std::to_string(messages->size()) +
                                             " messages, at most " +
                                             std::to_string(limits.max_messages) + " are accepted",
                                         "messages"));
  }
  MediaReader media(limits);
  std::vector<EarlierTurn> turns;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string path = index_path("messages", i);
    if (!message.is_object()) wrong_type(path, "an object (a message)", message);
    const json* role_value = field(message, "role");
    if (role_value == nullptr)
      fail(path + ".role", "'" + path + ".role' is required", "missing_field");
    std::string role = get_string(*role_value, path + ".role");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      invalid_value(path + ".role",
                    "unknown role " + quote_value(role) + " (system, developer, user, assistant)");
    }
    check_keys(message, path, {"role", "content", "name"});
    if (const json* name = field(message, "name")) get_string(*name, path + ".name");
    const json* content = field(message, "content");
    if (content == nullptr)
      fail(path + ".content", "'" + path + ".content' is required", "missing_field");
    const std::string content_path = path + ".content";
    EarlierTurn turn;
    turn.role = role;
    turn.parts = read_content(*content, content_path, role, media, out);
    // The first message, when it is a system one, is the system prompt; any later one a turn.
    if (role == "system" && i == 0) {
      out.system_prompt = text_of(turn.parts);
      continue;
    }
    turns.push_back(std::move(turn));
  }
  out.image_pixels = media.image_pixels();
  if (turns.empty()) fail("messages", "'messages' must contain a user message", "missing_field");
  if (turns.back().role != "user") {
    invalid_value(index_path("messages", messages->size() - 1),
                  "the last message must be a user turn (the one to answer), not " +
                      quote_value(turns.back().role));
  }
  out.parts = std::move(turns.back().parts);
  turns.pop_back();
  out.history = std::move(turns);
}

// --- everything else ----------------------------------------------------------------------

// Fields we do not use: refused unless they ask for what we do anyway.
void check_ignored_fields(const json& root) {
  if (const json* n = field(root, "n"); n != nullptr && get_int(*n, "n") != 1) {
    unsupported("n", "only one choice per request is supported (n = 1)");
  }
  if (const json* v = field(root, "logprobs"); v != nullptr && get_bool(*v, "logprobs")) {
    unsupported("logprobs", "logprobs are not supported");
  }
  if (const json* v = field(root, "top_logprobs");
      v != nullptr && get_int(*v, "top_logprobs") != 0) {
    unsupported("top_logprobs", "logprobs are not supported");
  }
  for (const char* penalty : {"frequency_penalty", "presence_penalty"}) {
    if (const json* v = field(root, penalty); v != nullptr && get_number(*v, penalty) != 0) {
      unsupported(penalty,
                  std::string(penalty) +
                      " is not supported (use repetition_penalty); send 0 or leave it out");
    }
  }
  if (const json* v = field(root, "user")) get_string(*v, "user");
  for (const char* list : {"tools", "functions"}) {
    if (const json* v = field(root, list); v != nullptr && !(v->is_array() && v->empty())) {
      unsupported(list, "tool calling is not supported");
    }
  }
  for (const char* choice : {"tool_choice", "function_call"}) {
    if (const json* v = field(root, choice); v != nullptr && *v != "none") {
      unsupported(choice, "tool calling is not supported");
    }
  }
  if (const json* v = field(root, "response_format");
      v != nullptr && *v != json{{"type", "text"}}) {
    unsupported("response_format",
                "response formats other than {\"type\": \"text\"} are not supported");
  }
}

void read_output(const json& root, ChatCompletionRequest& out) {
  if (const json* m = field(root, "modalities")) {
    if (!m->is_array()) wrong_type("modalities", "an array of strings", *m);
    if (m->empty()) invalid_value("modalities", "at least one of \"text\", \"audio\" is required");
    out.modalities.clear();
    for (size_t i = 0; i < m->size(); ++i) {
      const std::string path = index_path("modalities", i);
      const std::string& name = get_string((*m)[i], path);
      if (name != "text" && name != "audio") {
        invalid_value(path, "unknown modality " + quote_value(name) + " (text, audio)");
      }
      if (std::find(out.modalities.begin(), out.modalities.end(), name) == out.modalities.end()) {
        out.modalities.push_back(name);
      }
    }
    out.modalities_given = true;
  }
  std::string voice;
  if (const json* audio = field(root, "audio")) {
    if (!audio->is_object()) wrong_type("audio", "an object", *audio);
    check_keys(*audio, "audio", {"voice", "format"});
    if (const json* v = field(*audio, "voice")) voice = get_string(*v, "audio.voice");
    if (const json* f = field(*audio, "format")) {
      const std::string& format = get_string(*f, "audio.format");
      if (format != "wav") {
        unsupported("audio.format",
                    "audio.format " + quote_value(format) + " is not supported: only \"wav\"");
      }
      out.audio_format = format;
    }
  }
  if (const json* s = field(root, "speaker")) out.speaker = get_string(*s, "speaker");
  if (!voice.empty()) {
    if (!out.speaker.empty() && ascii_lower(out.speaker) != ascii_lower(voice)) {
      invalid_value("speaker", "'speaker' " + quote_value(out.speaker) + " and 'audio.voice' " +
                                   quote_value(voice) + " differ: give one");
    }
    if (out.speaker.empty()) out.speaker = voice;
  }
}

constexpr double kMinTemperature = 1e-5;
constexpr double kMinRepetitionPenalty = 0.01, kMaxRepetitionPenalty = 100;

void read_sampling(const json& root, ChatCompletionRequest& out) {
  if (const json* v = field(root, "temperature")) {
    const double t = get_number(*v, "temperature");
    if (t < 0 || t > 2) invalid_value("temperature", "must be between 0 and 2");
    // Logits divided by less would overflow; a temperature this close to 0 is greedy anyway.
    if (t > 0 && t < kMinTemperature) {
      invalid_value("temperature", "must be 0 (greedy) or at least 1e-05");
    }
    out.temperature = t;
  }
  if (const json* v = field(root, "top_p")) {
    const double p = get_number(*v, "top_p");
    if (!(p > 0 && p <= 1)) invalid_value("top_p", "must be in (0, 1]");
    out.top_p = p;
  }
  if (const json* v = field(root, "top_k")) {
    const int64_t k = get_int(*v, "top_k");
    if (k < -1) invalid_value("top_k", "must be >= 0 (0 or -1: off)");
    out.top_k = std::max<int64_t>(k, 0);
  }
  if (const json* v = field(root, "repetition_penalty")) {
    const double r = get_number(*v, "repetition_penalty");
    if (!(r > 0)) invalid_value("repetition_penalty", "must be > 0");
    // It divides or multiplies logits: beyond these they overflow or vanish.
    if (r < kMinRepetitionPenalty || r > kMaxRepetitionPenalty) {
      invalid_value("repetition_penalty", "must be between 0.01 and 100");
    }
    out.repetition_penalty = r;
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(root, name)) {
      const int64_t n = get_int(*v, name);
      if (n < 1) invalid_value(name, "must be >= 1");
      if (out.max_tokens && *out.max_tokens != n) {
        invalid_value(name, "max_tokens and max_completion_tokens differ: give one");
      }
      out.max_tokens = n;
    }
  }
  // Our extension: the talker's frame cap (80 ms each).
  if (const json* v = field(root, "max_audio_frames")) {
    const int64_t n = get_int(*v, "max_audio_frames");
    if (n < 1) invalid_value("max_audio_frames", "must be >= 1");
    out.max_audio_frames = n;
  }
  if (const json* v = field(root, "seed")) out.seed = get_seed(*v, "seed");
  if (const json* v = field(root, "stop")) {
    if (v->is_string()) {
      out.stop.push_back(get_string(*v, "stop"));
    } else if (v->is_array()) {
      if (v->size() > 4) invalid_value("stop", "at most 4 stop strings");
      for (size_t i = 0; i < v->size(); ++i)
        out.stop.push_back(get_string((*v)[i], index_path("stop", i)));
    } else {
      wrong_type("stop", "a string or an array of strings", *v);
    }
    for (size_t i = 0; i < out.stop.size(); ++i) {
      if (out.stop[i].empty()) {
        invalid_value(v->is_string() ? "stop" : index_path("stop", i),
                      "stop strings must not be empty");
      }
    }
  }
}

void read_stream(const json& root, ChatCompletionRequest& out) {
  if (const json* v = field(root, "stream")) out.stream = get_bool(*v, "stream");
  if (const json* options = field(root, "stream_options")) {
    if (!options->is_object()) wrong_type("stream_options", "an object", *options);
    check_keys(*options, "stream_options", {"include_usage"});
    if (!out.stream) invalid_value("stream_options", "only allowed when 'stream' is true");
    if (const json* v = field(*options, "include_usage")) {
      out.include_usage = get_bool(*v, "stream_options.include_usage");
    }
  }
}

}  // namespace

std::string text_of(const std::vector<ContentPart>& parts) {
  std::string text;
  for (const auto& part : parts) {
    if (part.kind == ContentPart::Kind::kText) text += part.text;
  }
  return text;
}

ChatCompletionRequest parse_chat_completion(std::string_view body, const ParseLimits& limits) {
  size_t values = 0;
  detail::BodyLimits body_limits;
  body_limits.max_depth = limits.max_depth;
  body_limits.max_values = limits.max_json_values;
  body_limits.text_keys = {"content", "text"};
  body_limits.max_text_bytes = limits.max_text_bytes;
  body_limits.text_param = "messages";
  body_limits.text_why = limits.text_limit_why;
  const json root = parse_body(body, body_limits, &values);
  if (!root.is_object()) wrong_type("", "a JSON object", root);
  check_keys(root, "",
             {// used
              "model", "messages", "modalities", "audio", "speaker", "temperature", "top_p",
              "top_k", "repetition_penalty", "max_tokens", "max_completion_tokens", "seed", "stop",
              "stream", "stream_options", "max_audio_frames",
              // accepted when they ask for the default (check_ignored_fields)
              "n", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "tools",
              "tool_choice", "functions", "function_call", "response_format",
              // accepted and ignored
              "user", "metadata", "store", "service_tier", "parallel_tool_calls"});
  ChatCompletionRequest out;
  out.json_values = values;
  const json* model = field(root, "model");
  if (model == nullptr) fail("model", "'model' is required", "missing_field");
  out.model = get_string(*model, "model");
  if (out.model.empty()) invalid_value("model", "must not be empty");
  check_ignored_fields(root);
  read_output(root, out);
  read_sampling(root, out);
  read_stream(root, out);
  // Last: the media are the expensive part.
  read_messages(root, limits, out);
  return out;
}

}  // namespace omni::http
