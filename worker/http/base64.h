// Base64 (RFC 4648, standard alphabet) and data: URLs (RFC 2397): how OpenAI requests carry
// audio and images, and how responses carry WAV audio.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace omni::http {

// Standard alphabet, padded with '=' to a multiple of 4 characters.
std::string base64_encode(std::string_view bytes);

// Strict: the standard alphabet only (no URL-safe '-' '_'), padding required (the length must be
// a multiple of 4, so that a truncated payload is an error rather than shorter bytes), no
// whitespace or line breaks, and the unused bits of the last character must be zero (the only
// encoding of those bytes). std::nullopt on any violation.
std::optional<std::string> base64_decode(std::string_view text);

struct DataUrl {
  std::string media_type;  // lower case, without parameters ("image/png"); may be empty
  std::string data;        // the decoded bytes
};

// "data:[<mediatype>][;<param>=<value>]*[;base64],<data>". Base64 data is decoded with
// base64_decode; other data is percent-decoded. Throws ApiException 400 naming `param`:
// code remote_url for http(s):// or any other non-data URL (fetching URLs is not supported),
// invalid_value for a malformed data URL, invalid_base64 for a bad base64 payload.
DataUrl parse_data_url(const std::string& url, const std::string& param);

}  // namespace omni::http
