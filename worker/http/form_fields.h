// A multipart/form-data body as OpenAI's SDK sends /v1/videos and /v1/images/edits: its parts,
// and the text fields turned into the JSON object the route's JSON parser checks, so that a form
// and a JSON body meet the same rules and errors.
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace omni::http {

// One part of a multipart/form-data body.
struct FormField {
  std::string name, value;
  bool file = false;  // it has a filename (an upload, not a value)
};

// The text fields (`fields` holds no upload) as a JSON object: the values of the `numeric`
// fields that read as JSON numbers are numbers, the rest strings (so "n=abc" is refused as a
// string where an integer belongs, and a prompt "1984" stays text). A field given twice is
// refused (400 naming it).
nlohmann::json form_json(const std::vector<FormField>& fields,
                         const std::set<std::string>& numeric);

}  // namespace omni::http
