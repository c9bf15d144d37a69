// Request bodies for the protocol tests: a minimal valid request, media as the API carries them.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "worker/http/api_error.h"
#include "worker/http/base64.h"
#include "worker/http/openai_protocol.h"
#include "worker/http/wav_bytes.h"

namespace omni::http::testing {

using nlohmann::json;

// The smallest valid request.
inline json minimal_request() {
  return {{"model", "qwen3-omni"},
          {"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})}};
}

// The bytes of a 10 ms WAV (what the engine reads).
inline std::string wav_file() {
  std::vector<float> samples(240, 0.25f);
  return wav_bytes(samples.data(), samples.size(), 24000);
}

// Bytes that start like a PNG (the parser looks at formats only, never decodes).
inline std::string png_file() { return std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16); }

inline std::string flac_file() { return std::string("fLaC\0\0\0\x22", 8); }

// The error parse_chat_completion throws for `body` (a failure when it throws none).
inline ApiError parse_error(const std::string& body, const ParseLimits& limits = {}) {
  try {
    parse_chat_completion(body, limits);
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "no error for " << body.substr(0, 300);
  return {};
}

inline ApiError parse_error_of(const json& body, const ParseLimits& limits = {}) {
  return parse_error(body.dump(), limits);
}

}  // namespace omni::http::testing
