// The media parts of a chat request (image_url, audio_url, input_audio): data: URLs and base64
// decoded, formats sniffed from the bytes, image pixels and audio sample rates read from the
// headers, and the request's media counted against its limits. Not an API: the request parser's.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/http/base64.h"
#include "worker/http/openai_protocol.h"

namespace omni::http::detail {

class MediaReader {
 public:
  explicit MediaReader(const ParseLimits& limits) : limits_(limits) {}
  // Pixels of the images read so far, from their headers.
  uint64_t image_pixels() const { return pixels_; }

  // {"type": "image_url", "image_url": {"url": <data: URL>}}.
  MediaInput image_url(const nlohmann::json& part, const std::string& part_path);
  // {"type": "audio_url", "audio_url": {"url": <data: URL>}}.
  MediaInput audio_url(const nlohmann::json& part, const std::string& part_path);
  // OpenAI's {"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}.
  MediaInput input_audio(const nlohmann::json& part, const std::string& part_path);

 private:
  void check_audio_header(const std::string& data, const std::string& param) const;
  DataUrl read_url(const nlohmann::json& object, const std::string& path);
  void count(const std::string& data, const std::string& param);

  const ParseLimits& limits_;
  size_t total_ = 0, items_ = 0;
  uint64_t pixels_ = 0;
};

}  // namespace omni::http::detail
