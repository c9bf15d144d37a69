#include "worker/http/api_error.h"

#include <nlohmann/json.hpp>

#include <utility>

namespace omni::http {
namespace {

ApiError make(int status, std::string type, std::string message, std::string param,
              std::string code) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

}  // namespace

std::string ApiError::json() const {
  using nlohmann::json;
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", std::move(error)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiException::ApiException(ApiError e) : error_(std::move(e)) {}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return make(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

ApiError request_too_large(std::string message, std::string param) {
  return make(413, "invalid_request_error", std::move(message), std::move(param),
              "request_too_large");
}

ApiError unauthorized(std::string message) {
  return make(401, "authentication_error", std::move(message), "", "invalid_api_key");
}

ApiError model_not_found(std::string message) {
  return make(404, "not_found_error", std::move(message), "model", "model_not_found");
}

ApiError rate_limited(std::string message) {
  return make(429, "rate_limit_error", std::move(message), "", "");
}

ApiError server_error(std::string message) {
  return make(500, "server_error", std::move(message), "", "");
}

}  // namespace omni::http
