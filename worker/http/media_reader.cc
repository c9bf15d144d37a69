#include "worker/http/media_reader.h"

#include <optional>
#include <string_view>
#include <utility>

#include "worker/http/ascii_text.h"
#include "worker/http/request_json.h"

namespace omni::http::detail {
namespace {

using nlohmann::json;

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

// What a WAV's fmt chunk or a FLAC's STREAMINFO declares, read before decoding: a WAV declared
// at 1 Hz is resampled to 16000 times its size, one declaring 1,024 channels is decoded into
// 1,024 buffers. Nullopt for other formats (MP3 holds at most two channels).
struct AudioHeader {
  uint64_t sample_rate = 0, channels = 0;
};
std::optional<AudioHeader> audio_header(const std::string& b) {
  const auto byte = [&](size_t i) { return static_cast<uint64_t>(static_cast<uint8_t>(b[i])); };
  const auto le16 = [&](size_t i) { return byte(i) | byte(i + 1) << 8; };
  const auto le32 = [&](size_t i) { return le16(i) | le16(i + 2) << 16; };
  if (sniff_audio(b) == "wav") {
    for (size_t pos = 12; pos + 8 <= b.size();) {
      const uint64_t size = le32(pos + 4);
      if (b.compare(pos, 4, "fmt ") == 0) {
        if (pos + 16 > b.size()) return std::nullopt;
        return AudioHeader{le32(pos + 12), le16(pos + 10)};
      }
      pos += 8 + size + (size & 1);
    }
    return std::nullopt;
  }
  // "fLaC", a metadata block header, then STREAMINFO: the rate is 20 bits at its byte 10, the
  // channels less one the next 3 bits.
  if (sniff_audio(b) == "flac" && b.size() >= 21 && (byte(4) & 0x7F) == 0) {
    return AudioHeader{byte(18) << 12 | byte(19) << 4 | byte(20) >> 4, ((byte(20) >> 1) & 7) + 1};
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

}  // namespace

MediaInput MediaReader::image_url(const json& part, const std::string& part_path) {
  const std::string path = join_path(part_path, "image_url");
  const json* object = field(part, "image_url");
  if (object == nullptr) fail(path, "'" + path + "' is required", "missing_field");
  if (!object->is_object()) wrong_type(path, "an object", *object);
  check_keys(*object, path, {"url", "detail"});
  if (const json* detail = field(*object, "detail")) get_string(*detail, join_path(path, "detail"));
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

MediaInput MediaReader::audio_url(const json& part, const std::string& part_path) {
  const std::string path = join_path(part_path, "audio_url");
  const json* object = field(part, "audio_url");
  if (object == nullptr) fail(path, "'" + path + "' is required", "missing_field");
  if (!object->is_object()) wrong_type(path, "an object", *object);
  check_keys(*object, path, {"url"});
  DataUrl url = read_url(*object, path);
  MediaInput m{"audio", part_path, "", std::move(url.data)};
  m.format = audio_format(url.media_type, m.data, join_path(path, "url"));
  check_audio_header(m.data, join_path(path, "url"));
  return m;
}

MediaInput MediaReader::input_audio(const json& part, const std::string& part_path) {
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
  check_audio_header(m.data, data_path);
  return m;
}

void MediaReader::check_audio_header(const std::string& data, const std::string& param) const {
  const auto header = audio_header(data);
  if (!header) return;
  const uint64_t rate = header->sample_rate;
  if (rate < limits_.min_audio_sample_rate || rate > limits_.max_audio_sample_rate) {
    fail(param,
         param + ": the audio's header declares " + std::to_string(rate) + " Hz, outside the " +
             std::to_string(limits_.min_audio_sample_rate) + "-" +
             std::to_string(limits_.max_audio_sample_rate) + " Hz this server reads",
         "unsupported_sample_rate");
  }
  if (header->channels == 0 || header->channels > limits_.max_audio_channels) {
    fail(param,
         param + ": the audio's header declares " + std::to_string(header->channels) +
             " channels; this server reads 1 to " + std::to_string(limits_.max_audio_channels),
         "unsupported_channels");
  }
}

DataUrl MediaReader::read_url(const json& object, const std::string& path) {
  const std::string url_path = join_path(path, "url");
  const json* url = field(object, "url");
  if (url == nullptr) fail(url_path, "'" + url_path + "' is required", "missing_field");
  DataUrl out = parse_data_url(get_string(*url, url_path), url_path);
  count(out.data, url_path);
  return out;
}

void MediaReader::count(const std::string& data, const std::string& param) {
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

}  // namespace omni::http::detail
