// ASCII case folding and blank trimming for HTTP header values and request names, shared by the
// HTTP layer (header names and values, media types, voices are ASCII).
#pragma once

#include <cctype>
#include <string>

namespace omni::http {

inline std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Without leading and trailing spaces and tabs.
inline std::string trim_blanks(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace omni::http
