// JSON text for the engine's hand-written stats lines. Internal to the engine.
#pragma once

#include <cstdio>
#include <string>

namespace omni::offload {

// A JSON string literal of `text`: quotes, backslashes and control bytes escaped.
inline std::string json_quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\u%04x", c);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace omni::offload
