// The OpenAI chat-completions protocol, apart from HTTP and from the engine: a request body
// parsed and validated into a plain struct (errors as OpenAI returns them, naming the field), and
// the response and streamed-chunk JSON built from plain values.
//
// Scope: one user turn (plus system/developer turns), its text, audio and images; answers in
// text and/or audio (Qwen3-Omni). Media travel inside the request (base64 or data: URLs): the
// server fetches no URLs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "worker/http/api_error.h"

namespace omni::http {

struct MediaInput {
  std::string kind;    // "audio" | "image"
  std::string param;   // where it came from, e.g. "messages[1].content[2]" (for error messages)
  std::string format;  // audio: wav | mp3 | flac; image: png | jpeg
  std::string data;    // the decoded bytes
};

// A piece of a message's content, in the order the message gives it: text, or the next of
// ChatCompletionRequest::audio / ::images.
struct ContentPart {
  enum class Kind { kText, kAudio, kImage };
  Kind kind = Kind::kText;
  std::string text;  // kText
};

// A turn of the conversation before the one to answer.
struct EarlierTurn {
  std::string role;                // "system", "user" or "assistant"
  std::vector<ContentPart> parts;  // text parts only, except in a user turn
};

// The text parts of `parts`, joined as the chat template joins them (nothing between).
std::string text_of(const std::vector<ContentPart>& parts);

struct ChatCompletionRequest {
  std::string model;  // required, non-empty
  // The text of the first message when it is a system or developer message (later ones are
  // turns of `history`), its parts joined as the chat template joins them.
  std::string system_prompt;
  std::vector<EarlierTurn> history;  // the turns between the system prompt and the last message
  std::vector<ContentPart> parts;    // the last message (a user turn), in order
  std::vector<MediaInput> audio, images;                    // every user turn's inputs, in order
  std::vector<std::string> modalities = {"text", "audio"};  // without duplicates, in given order
  bool modalities_given = false;
  std::string speaker;               // "speaker", or audio.voice; empty = the model's default
  std::string audio_format = "wav";  // audio.format: only "wav"
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k;             // 0 = off (-1 in the request is normalised to 0)
  std::optional<int64_t> max_tokens;        // max_tokens or max_completion_tokens
  std::optional<int64_t> max_audio_frames;  // our extension: the talker's frame cap
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // up to 4 non-empty strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // What parsing saw, for the server's byte budget: JSON values made, image pixels declared.
  size_t json_values = 0;
  uint64_t image_pixels = 0;
};

struct ParseLimits {
  // JSON nesting, checked by a byte scan before parsing: a deep body costs a linear scan and
  // nothing else. A valid request nests 5 levels deep.
  size_t max_depth = 32;
  size_t max_media_bytes = size_t{64} << 20;  // decoded audio and image bytes, per request
  size_t max_messages = 256;
  size_t max_media_items = 16;  // audio and image parts, per request
  // Pixels of all images of a request, read from their PNG / JPEG headers before decoding (a
  // 12000x12000 PNG of 410 KB decodes to 432 MB).
  uint64_t max_image_pixels = uint64_t{1} << 25;
  // Sample rates and channels an audio part's header may declare (WAV, FLAC; the stage checks
  // the others before decoding).
  uint64_t min_audio_sample_rate = 8000;
  uint64_t max_audio_sample_rate = 192000;
  uint64_t max_audio_channels = 8;
  // JSON values (keys count) the body may make while it is parsed (a bounded DOM: see
  // request_json.h). A request of 256 messages with a few parts each makes a few thousand.
  size_t max_json_values = 65536;
  // The bytes of text ("content" and "text" strings) a request may hold together, from the
  // model's context (StageInfo::max_prompt_bytes); 0: no limit. `text_limit_why` says what
  // sets it, for the error.
  size_t max_text_bytes = 0;
  std::string text_limit_why = "the model's context";
};

// Parses and validates a POST /v1/chat/completions body. Throws ApiException (and nothing else)
// on any problem, with `param` set to the field's JSON path
// ("messages[1].content[0].image_url.url") and one of these codes:
// - 400 invalid_json: not JSON (the message gives the parser's byte position), or nested deeper
//   than limits.max_depth; 413 request_too_large: more than limits.max_json_values values;
// - 400 invalid_type: a field of the wrong JSON type (the message says which type is expected),
//   the body not an object;
// - 400 missing_field: no model, no messages, no user message, a message without role or
//   content, a content part without its type or data;
// - 400 unknown_field: a field this server does not know, at any level. These OpenAI fields are
//   accepted and ignored: user, metadata, store, service_tier, parallel_tool_calls; and accepted
//   when they ask for the default only (else code unsupported): n (1), logprobs (false),
//   top_logprobs (0), frequency_penalty and presence_penalty (0: a penalty silently ignored would
//   change the answer), tools and functions ([]), tool_choice and function_call ("none"),
//   response_format ({"type": "text"}). null counts as absent for every optional field;
// - 400 invalid_value: a conversation whose last message is not a user turn;
// - 400 unsupported: media in an assistant turn, content
//   parts of types we know but do not take (video_url, file, ...), audio formats other than
//   wav/mp3/flac, image formats other than PNG/JPEG, audio.format other than "wav";
// - 400 invalid_value: an unknown role or content-part type, a modality outside {text, audio}
//   or none, temperature outside [0, 2], top_p outside (0, 1], top_k < -1, max_tokens < 1,
//   repetition_penalty outside [0.01, 100], a temperature between 0 and 1e-05, a negative seed,
//   integers out of range or with a fraction, more than 4 or empty stop strings, max_tokens and
//   max_completion_tokens that differ, speaker and audio.voice that differ, stream_options without
//   stream, an empty model, a number too large for a double (1e400), empty media;
// - 400 remote_url: an image_url/audio_url that is not a data: URL;
// - 400 invalid_base64: a payload that is not strict base64 (see base64_decode);
// - 413 request_too_large: more than limits.max_messages messages, limits.max_media_items
//   media parts, limits.max_media_bytes of decoded media or limits.max_image_pixels of image
//   pixels (from the image headers, before any image is decoded);
// - 400 unsupported_sample_rate / unsupported_channels: an audio header (WAV, FLAC) declaring a
//   rate or a channel count outside the limits;
// - 400 context_length_exceeded: more than limits.max_text_bytes of text, found by a byte scan
//   before the body is parsed.
// Values quoted in messages and field names in `param` are cut after 64 bytes.
ChatCompletionRequest parse_chat_completion(std::string_view body, const ParseLimits& limits = {});

// --- responses, as vLLM-Omni returns them -------------------------------------------------------

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;  // total_tokens is their sum
};

struct AudioOutput {
  std::string id;
  std::string wav_base64;
  int64_t expires_at = 0;
  std::string transcript;  // the text the audio speaks
};

// {"id", "object": "chat.completion", "created", "model", "choices": [...], "usage":
// {"prompt_tokens", "completion_tokens", "total_tokens"}}. One choice per output, indexed in
// order: the text ({"role": "assistant", "content": text}) when `text` is given, then the audio
// ({"role": "assistant", "content": null, "audio": {"id", "data", "expires_at",
// "transcript"}}). Without text (modalities ["audio"]) the audio choice is choices[0]; its
// transcript still carries the text. Each choice has "logprobs": null and `finish_reason`
// (empty = null).
std::string completion_json(const std::string& id, const std::string& model, int64_t created,
                            const std::optional<std::string>& text,
                            const std::optional<AudioOutput>& audio,
                            const std::string& finish_reason, const Usage& usage);

// One streamed chunk (the JSON after "data: "): {"id", "object": "chat.completion.chunk",
// "created", "model", "modality": "text" | "audio", "choices": [{"index": 0, "delta": {...},
// "logprobs": null, "finish_reason": null | reason}]}. The delta holds "role": "assistant" when
// `first`, and "content" (text, or a base64 WAV for audio) unless it is empty and not the first:
// the last chunk, carrying only the finish reason, has an empty delta as OpenAI's does.
std::string chunk_json(const std::string& id, const std::string& model, int64_t created,
                       const std::string& modality, const std::string& content, bool first,
                       const std::optional<std::string>& finish_reason);

// The usage chunk sent last when stream_options.include_usage is true: "choices": [] and
// "usage": {...}.
std::string usage_chunk_json(const std::string& id, const std::string& model, int64_t created,
                             const Usage& usage);

// "data: <json>\n\n": one server-sent event (the JSON is one line: strings escape newlines).
std::string sse_event(const std::string& json);
// "data: [DONE]\n\n": the end of the stream.
std::string sse_done();

}  // namespace omni::http
