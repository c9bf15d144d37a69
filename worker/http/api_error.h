// Errors as the OpenAI API returns them: an HTTP status and the body
// {"error": {"message", "type", "param", "code"}}. The protocol layer throws ApiException; the
// HTTP front end catches it once and sends error().status with error().json().
#pragma once

#include <exception>
#include <string>

namespace omni::http {

struct ApiError {
  int status = 400;
  std::string message;
  // invalid_request_error | authentication_error | not_found_error | rate_limit_error |
  // server_error
  std::string type = "invalid_request_error";
  // The JSON path of the offending field ("messages[1].content[0].image_url.url"); empty = null.
  std::string param;
  // What went wrong, for programs: invalid_json, unknown_field, invalid_type, invalid_value,
  // missing_field, unsupported, model_not_found, invalid_base64, remote_url, request_too_large;
  // empty = null.
  std::string code;

  // The response body. Always valid UTF-8: invalid bytes (a message quoting the request) are
  // replaced with U+FFFD.
  std::string json() const;
};

class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError e);
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

// `message` (an internal error's text) as a client may see it: without the source locations
// and check conditions of omni::Error ("... (expected n > 0) [sampler.cc:50]") and with the
// server's temporary folders (media, MP4 encoding, video jobs) cut from file paths
// ("/tmp/omni-media-Ab12Cd/input-0.wav" becomes "input-0.wav").
std::string public_error_message(const std::string& message);

// Any status, type and code (the endpoints' own: video_not_found, queue_timeout, ...).
ApiError api_error(int status, std::string type, std::string code, std::string message,
                   std::string param = "");
// 400 invalid_request_error.
ApiError bad_request(std::string message, std::string param = "", std::string code = "");
// 413 invalid_request_error, code request_too_large.
ApiError request_too_large(std::string message, std::string param = "");
// 400 invalid_request_error, code media_too_large: a request's media over a limit of the
// server's (--max-media-items, --max-image-pixels, media bytes), refused before decoding.
ApiError media_too_large(std::string message, std::string param);
// 401 authentication_error, code invalid_api_key.
ApiError unauthorized(std::string message);
// 404 not_found_error, param "model", code model_not_found.
ApiError model_not_found(std::string message);
// 429 rate_limit_error.
ApiError rate_limited(std::string message);
// 500 server_error.
ApiError server_error(std::string message);

}  // namespace omni::http
