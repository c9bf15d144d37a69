#include "worker/http/openai_protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "worker/http/ascii_text.h"
#include "worker/http/base64.h"

namespace omni::http {
namespace {

using nlohmann::json;

// --- errors -------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& param, std::string message, std::string code) {
  throw ApiException(bad_request(std::move(message), param, std::move(code)));
}

// A value from the request, quoted for a message: long values are cut (a message must not echo
// megabytes back).
std::string quote_value(std::string_view value) {
  constexpr size_t kMax = 64;
  if (value.size() <= kMax) return "'" + std::string(value) + "'";
  return "'" + std::string(value.substr(0, kMax)) + "...'";
}

const char* type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unknown value";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const std::string& expected,
                             const json& got) {
  const std::string what = param.empty() ? "the request body" : "'" + param + "'";
  fail(param, "invalid type for " + what + ": expected " + expected + ", got " + type_of(got),
       "invalid_type");
}

[[noreturn]] void invalid_value(const std::string& param, const std::string& why) {
  fail(param, "invalid value for '" + param + "': " + why, "invalid_value");
}

[[noreturn]] void unsupported(const std::string& param, const std::string& why) {
  fail(param, why, "unsupported");
}

// --- JSON access --------------------------------------------------------------------------

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
std::string index_path(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

// The field, or nullptr when it is absent or null (clients send null for "not set").
const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// Rejects keys outside `known` with code unknown_field.
void check_keys(const json& object, const std::string& path,
                std::initializer_list<const char*> known) {
  for (const auto& item : object.items()) {
    const bool ok =
        std::any_of(known.begin(), known.end(), [&](const char* k) { return item.key() == k; });
    if (!ok) {
      fail(join_path(path, item.key()),
           "unknown field " + quote_value(item.key()) + (path.empty() ? "" : " in '" + path + "'"),
           "unknown_field");
    }
  }
}

const std::string& get_string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

double get_number(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x)) invalid_value(param, "must be a finite number");
  return x;
}

// An integer, also written as a float without fraction (1.0, 1e3), as Python clients may.
int64_t get_int(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      invalid_value(param, "out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(param, "an integer", v);
    // [-2^63, 2^63): both bounds are exact doubles.
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
      invalid_value(param, "out of range");
    }
    return static_cast<int64_t>(d);
  }
  wrong_type(param, "an integer", v);
}

uint64_t get_seed(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) invalid_value(param, "must be >= 0");
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(param, "an integer", v);
    if (d < 0) invalid_value(param, "must be >= 0");
    if (d >= 18446744073709551616.0) invalid_value(param, "out of range");  // 2^64
    return static_cast<uint64_t>(d);
  }
  wrong_type(param, "an integer", v);
}

// --- the body -----------------------------------------------------------------------------

// nlohmann's parser and destructor keep heap stacks, but copying or dumping a value recurses,
// and building a DOM 100000 levels deep is wasted work anyway: bodies nested deeper than any
// request can be are refused first, by a byte scan that tracks strings exactly as JSON does (so
// it agrees with the parser on every prefix the parser accepts).
void check_depth(std::string_view body, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        fail("",
             "the request body nests JSON more than " + std::to_string(max_depth) +
                 " levels deep (at byte " + std::to_string(i) + ")",
             "invalid_json");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

// nlohmann's messages start with "[json.exception.parse_error.101] ": the part after it is for
// people.
std::string without_exception_id(const char* what) {
  const char* p = std::strchr(what, ']');
  std::string s = p != nullptr && what[0] == '[' ? std::string(p + 1) : std::string(what);
  if (!s.empty() && s[0] == ' ') s.erase(0, 1);
  constexpr size_t kMax = 300;  // "last read: '...'" quotes the token, which may be huge
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

json parse_body(std::string_view body, size_t max_depth) {
  check_depth(body, max_depth);
  try {
    return json::parse(body.data(), body.data() + body.size());
  } catch (const json::parse_error& e) {
    fail("",
         "the request body is not valid JSON (byte " + std::to_string(e.byte) +
             "): " + without_exception_id(e.what()),
         "invalid_json");
  } catch (const json::out_of_range& e) {
    // 406: a number beyond the range of a double (1e400).
    fail("", "the request body holds a number out of range: " + without_exception_id(e.what()),
         "invalid_value");
  } catch (const json::exception& e) {
    fail("", "the request body is not valid JSON: " + without_exception_id(e.what()),
         "invalid_json");
  }
}

// --- media --------------------------------------------------------------------------------

bool has_prefix(const std::string& bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() && bytes.compare(0, prefix.size(), prefix) == 0;
}

// The format from the bytes, for data: URLs without a media type.
std::string sniff_image(const std::string& b) {
  if (has_prefix(b, "\x89PNG\r\n\x1a\n")) return "png";
  if (has_prefix(b, "\xFF\xD8\xFF")) return "jpeg";
  return "";
}
// Width and height from a PNG's IHDR or a JPEG's start-of-frame segment, read before decoding;
// nullopt when the header is not there (the decoder then refuses the bytes, having allocated
// nothing large).
std::optional<std::pair<uint64_t, uint64_t>> image_size(const std::string& b) {
  const auto byte = [&](size_t i) { return static_cast<uint64_t>(static_cast<uint8_t>(b[i])); };
  const auto be16 = [&](size_t i) { return byte(i) << 8 | byte(i + 1); };
  const auto be32 = [&](size_t i) { return be16(i) << 16 | be16(i + 2); };
  if (sniff_image(b) == "png") {
    if (b.size() < 24 || b.compare(12, 4, "IHDR") != 0) return std::nullopt;
    return std::make_pair(be32(16), be32(20));
  }
  if (sniff_image(b) != "jpeg") return std::nullopt;
  size_t pos = 2;
  while (pos + 4 <= b.size()) {
    if (byte(pos) != 0xFF) return std::nullopt;
    const uint64_t marker = byte(pos + 1);
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if ((marker >= 0xD0 && marker <= 0xD9) || marker == 0x01) {  // no length
      pos += 2;
      continue;
    }
    // SOF0..SOF15, less DHT (C4), JPG (C8) and DAC (CC): length, precision, height, width.
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      if (pos + 9 > b.size()) return std::nullopt;
      return std::make_pair(be16(pos + 7), be16(pos + 5));
    }
    pos += 2 + static_cast<size_t>(be16(pos + 2));
  }
  return std::nullopt;
}

std::string sniff_audio(const std::string& b) {
  if (has_prefix(b, "RIFF") && b.size() >= 12 && b.compare(8, 4, "WAVE") == 0) return "wav";
  if (has_prefix(b, "fLaC")) return "flac";
  if (has_prefix(b, "ID3")) return "mp3";
  // An MPEG audio frame sync (11 set bits) with layer III.
  if (b.size() >= 2 && static_cast<uint8_t>(b[0]) == 0xFF &&
      (static_cast<uint8_t>(b[1]) & 0xE6) == 0xE2) {
    return "mp3";
  }
  return "";
}

std::string image_format(const std::string& media_type, const std::string& bytes,
                         const std::string& param) {
  if (media_type == "image/png") return "png";
  if (media_type == "image/jpeg" || media_type == "image/jpg" || media_type == "image/pjpeg") {
    return "jpeg";
  }
  if (media_type.empty() || media_type == "application/octet-stream") {
    std::string sniffed = sniff_image(bytes);
    if (sniffed.empty()) {
      unsupported(param, param +
                             ": the data: URL has no image media type and the bytes are not "
                             "PNG or JPEG: send data:image/png or data:image/jpeg");
    }
    return sniffed;
  }
  if (media_type.rfind("image/", 0) == 0) {
    unsupported(param,
                param + ": " + quote_value(media_type) + " images are not supported (PNG, JPEG)");
  }
  invalid_value(param, "expected an image media type (image/png, image/jpeg), got " +
                           quote_value(media_type));
}

// The sample rate a WAV's fmt chunk or a FLAC's STREAMINFO declares, read before decoding (a
// WAV declared at 1 Hz is resampled to 16000 times its size); nullopt for other formats.
std::optional<uint64_t> audio_sample_rate(const std::string& b) {
  const auto byte = [&](size_t i) { return static_cast<uint64_t>(static_cast<uint8_t>(b[i])); };
  const auto le32 = [&](size_t i) {
    return byte(i) | byte(i + 1) << 8 | byte(i + 2) << 16 | byte(i + 3) << 24;
  };
  if (sniff_audio(b) == "wav") {
    for (size_t pos = 12; pos + 8 <= b.size();) {
      const uint64_t size = le32(pos + 4);
      if (b.compare(pos, 4, "fmt ") == 0) {
        if (pos + 16 > b.size()) return std::nullopt;
        return le32(pos + 12);
      }
      pos += 8 + size + (size & 1);
    }
    return std::nullopt;
  }
  // "fLaC", a metadata block header, then STREAMINFO: the rate is 20 bits at its byte 10.
  if (sniff_audio(b) == "flac" && b.size() >= 21 && (byte(4) & 0x7F) == 0) {
    return byte(18) << 12 | byte(19) << 4 | byte(20) >> 4;
  }
  return std::nullopt;
}

bool is_audio_format(const std::string& f) { return f == "wav" || f == "mp3" || f == "flac"; }

std::string audio_format(const std::string& media_type, const std::string& bytes,
                         const std::string& param) {
  if (media_type == "audio/wav" || media_type == "audio/x-wav" || media_type == "audio/wave" ||
      media_type == "audio/vnd.wave") {
    return "wav";
  }
  if (media_type == "audio/mpeg" || media_type == "audio/mp3" || media_type == "audio/mpeg3" ||
      media_type == "audio/x-mp3") {
    return "mp3";
  }
  if (media_type == "audio/flac" || media_type == "audio/x-flac") return "flac";
  if (media_type.empty() || media_type == "application/octet-stream") {
    std::string sniffed = sniff_audio(bytes);
    if (sniffed.empty()) {
      unsupported(param, param +
                             ": the data: URL has no audio media type and the bytes are not "
                             "WAV, MP3 or FLAC: send data:audio/wav (or audio/mpeg, "
                             "audio/flac)");
    }
    return sniffed;
  }
  if (media_type.rfind("audio/", 0) == 0) {
    unsupported(
        param, param + ": " + quote_value(media_type) + " audio is not supported (wav, mp3, flac)");
  }
  invalid_value(param, "expected an audio media type (audio/wav, audio/mpeg, audio/flac), got " +
                           quote_value(media_type));
}

// Parses the body's media while keeping count of their decoded size.
class MediaReader {
 public:
  explicit MediaReader(const ParseLimits& limits) : limits_(limits) {}

  MediaInput image_url(const json& part, const std::string& part_path) {
    const std::string path = join_path(part_path, "image_url");
    const json* object = field(part, "image_url");
    if (object == nullptr) fail(path, "'" + path + "' is required", "missing_field");
    if (!object->is_object()) wrong_type(path, "an object", *object);
    check_keys(*object, path, {"url", "detail"});
    if (const json* detail = field(*object, "detail"))
      get_string(*detail, join_path(path, "detail"));
    DataUrl url = read_url(*object, path);
    MediaInput m{"image", part_path, "", std::move(url.data)};
    m.format = image_format(url.media_type, m.data, join_path(path, "url"));
    if (const auto size = image_size(m.data)) {
      const std::string url_path = join_path(path, "url");
      // Each factor fits 32 bits: the product cannot overflow 64.
      pixels_ += size->first * size->second;
      if (pixels_ > limits_.max_image_pixels) {
        throw ApiException(
            media_too_large(url_path + ": the request's images hold " + std::to_string(pixels_) +
                                " pixels (this one " + std::to_string(size->first) + "x" +
                                std::to_string(size->second) + "), more than " +
                                std::to_string(limits_.max_image_pixels) + " (--max-image-pixels)",
                            url_path));
      }
    }
    return m;
  }

  MediaInput audio_url(const json& part, const std::string& part_path) {
    const std::string path = join_path(part_path, "audio_url");
    const json* object = field(part, "audio_url");
    if (object == nullptr) fail(path, "'" + path + "' is required", "missing_field");
    if (!object->is_object()) wrong_type(path, "an object", *object);
    check_keys(*object, path, {"url"});
    DataUrl url = read_url(*object, path);
    MediaInput m{"audio", part_path, "", std::move(url.data)};
    m.format = audio_format(url.media_type, m.data, join_path(path, "url"));
    check_sample_rate(m.data, join_path(path, "url"));
    return m;
  }

  // OpenAI's {"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}.
  MediaInput input_audio(const json& part, const std::string& part_path) {
    const std::string path = join_path(part_path, "input_audio");
    const json* object = field(part, "input_audio");
    if (object == nullptr) fail(path, "'" + path + "' is required", "missing_field");
    if (!object->is_object()) wrong_type(path, "an object", *object);
    check_keys(*object, path, {"data", "format"});
    const std::string data_path = join_path(path, "data"), format_path = join_path(path, "format");
    const json* data = field(*object, "data");
    if (data == nullptr) fail(data_path, "'" + data_path + "' is required", "missing_field");
    const json* format = field(*object, "format");
    if (format == nullptr) {
      fail(format_path, "'" + format_path + "' is required (wav, mp3, flac)", "missing_field");
    }
    MediaInput m{"audio", part_path, ascii_lower(get_string(*format, format_path)), ""};
    if (!is_audio_format(m.format)) {
      unsupported(format_path, format_path + ": audio format " + quote_value(m.format) +
                                   " is not supported (wav, mp3, flac)");
    }
    const std::string& text = get_string(*data, data_path);
    auto bytes = base64_decode(text);
    if (!bytes) {
      fail(data_path,
           data_path + ": not valid base64 (standard alphabet, padded, no whitespace)" +
               (text.rfind("data:", 0) == 0 ? ": it takes the base64 bytes, not a data: URL" : ""),
           "invalid_base64");
    }
    m.data = std::move(*bytes);
    count(m.data, data_path);
    check_sample_rate(m.data, data_path);
    return m;
  }

 private:
  void check_sample_rate(const std::string& data, const std::string& param) const {
    const auto rate = audio_sample_rate(data);
    if (rate && (*rate < limits_.min_audio_sample_rate || *rate > limits_.max_audio_sample_rate)) {
      fail(param,
           param + ": the audio's header declares " + std::to_string(*rate) + " Hz, outside the " +
               std::to_string(limits_.min_audio_sample_rate) + "-" +
               std::to_string(limits_.max_audio_sample_rate) + " Hz this server reads",
           "unsupported_sample_rate");
    }
  }

  DataUrl read_url(const json& object, const std::string& path) {
    const std::string url_path = join_path(path, "url");
    const json* url = field(object, "url");
    if (url == nullptr) fail(url_path, "'" + url_path + "' is required", "missing_field");
    DataUrl out = parse_data_url(get_string(*url, url_path), url_path);
    count(out.data, url_path);
    return out;
  }

  void count(const std::string& data, const std::string& param) {
    if (data.empty()) invalid_value(param, "the media is empty (0 bytes)");
    if (++items_ > limits_.max_media_items) {
      throw ApiException(media_too_large(param + ": the request holds more than " +
                                             std::to_string(limits_.max_media_items) +
                                             " media parts (--max-media-items)",
                                         param));
    }
    total_ += data.size();
    if (total_ > limits_.max_media_bytes) {
      throw ApiException(media_too_large(param + ": the request's media exceed " +
                                             std::to_string(limits_.max_media_bytes) + " bytes",
                                         param));
    }
  }

  const ParseLimits& limits_;
  size_t total_ = 0, items_ = 0;
  uint64_t pixels_ = 0;
};

// --- messages -----------------------------------------------------------------------------

void append_line(std::string& to, const std::string& text) {
  if (!to.empty()) to += "\n";
  to += text;
}

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

// System and developer messages: a string, or text parts.
void read_system(const json& content, const std::string& path, std::string& system_prompt) {
  if (content.is_string()) {
    append_line(system_prompt, content.get_ref<const std::string&>());
    return;
  }
  if (!content.is_array()) wrong_type(path, "a string or an array of content parts", content);
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_path = index_path(path, j);
    const std::string& type = part_type(content[j], part_path);
    if (type != "text") {
      unsupported(join_path(part_path, "type"),
                  part_path + ": system and developer messages hold text parts only, got " +
                      quote_value(type));
    }
    append_line(system_prompt, text_part(content[j], part_path));
  }
}

// An assistant turn of the history: its text (a string, or text parts).
std::string read_assistant(const json& content, const std::string& path) {
  if (content.is_string()) return content.get_ref<const std::string&>();
  if (!content.is_array()) wrong_type(path, "a string or an array of content parts", content);
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_path = index_path(path, j);
    const std::string& type = part_type(content[j], part_path);
    if (type != "text") {
      unsupported(join_path(part_path, "type"),
                  part_path + ": assistant turns hold text parts only, got " + quote_value(type));
    }
    append_line(text, text_part(content[j], part_path));
  }
  return text;
}

// A user turn: its text into `text`, its media appended to out.audio and out.images.
void read_user(const json& content, const std::string& path, MediaReader& media, std::string& text,
               ChatCompletionRequest& out) {
  if (content.is_string()) {
    text = content.get_ref<const std::string&>();
    return;
  }
  if (!content.is_array()) wrong_type(path, "a string or an array of content parts", content);
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_path = index_path(path, j);
    const json& part = content[j];
    const std::string& type = part_type(part, part_path);
    if (type == "text") {
      append_line(text, text_part(part, part_path));
    } else if (type == "image_url") {
      check_keys(part, part_path, {"type", "image_url"});
      out.images.push_back(media.image_url(part, part_path));
    } else if (type == "input_audio") {
      check_keys(part, part_path, {"type", "input_audio"});
      out.audio.push_back(media.input_audio(part, part_path));
    } else if (type == "audio_url") {
      check_keys(part, part_path, {"type", "audio_url"});
      out.audio.push_back(media.audio_url(part, part_path));
    } else if (is_known_unsupported_part(type)) {
      unsupported(join_path(part_path, "type"),
                  part_path + ": content parts of type " + quote_value(type) +
                      " are not supported (text, image_url, input_audio, audio_url)");
    } else {
      invalid_value(join_path(part_path, "type"), "unknown content part type " + quote_value(type) +
                                                      " (text, image_url, input_audio, audio_url)");
    }
  }
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
    if (role == "system" && turns.empty()) {
      read_system(*content, content_path, out.system_prompt);
      continue;
    }
    EarlierTurn turn;
    turn.role = role;
    if (role == "system") {
      read_system(*content, content_path, turn.text);
    } else if (role == "assistant") {
      turn.text = read_assistant(*content, content_path);
    } else {
      const size_t audio = out.audio.size(), images = out.images.size();
      read_user(*content, content_path, media, turn.text, out);
      turn.audio_count = out.audio.size() - audio;
      turn.image_count = out.images.size() - images;
    }
    turns.push_back(std::move(turn));
  }
  if (turns.empty()) fail("messages", "'messages' must contain a user message", "missing_field");
  if (turns.back().role != "user") {
    invalid_value(index_path("messages", messages->size() - 1),
                  "the last message must be a user turn (the one to answer), not " +
                      quote_value(turns.back().role));
  }
  out.text = std::move(turns.back().text);
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

// --- responses ----------------------------------------------------------------------------

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

ChatCompletionRequest parse_chat_completion(std::string_view body, const ParseLimits& limits) {
  const json root = parse_body(body, limits.max_depth);
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
