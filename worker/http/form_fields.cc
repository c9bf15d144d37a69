#include "worker/http/form_fields.h"

#include "worker/http/request_json.h"

namespace omni::http {

nlohmann::json form_json(const std::vector<FormField>& fields,
                         const std::set<std::string>& numeric) {
  nlohmann::json body = nlohmann::json::object();
  for (const auto& f : fields) {
    if (body.contains(f.name)) detail::invalid_value(f.name, "the field is given more than once");
    nlohmann::json value =
        numeric.count(f.name) ? nlohmann::json::parse(f.value, nullptr, false) : nlohmann::json();
    body[f.name] = value.is_number() ? value : nlohmann::json(f.value);
  }
  return body;
}

}  // namespace omni::http
