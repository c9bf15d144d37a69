// An ApiError as the HTTP answer: OpenAI's error JSON with the error's status, the one way every
// route of the server answers a refusal.
#pragma once

#include "worker/http/api_error.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace omni::http {

class ServerMetrics;

// The status and the JSON body, not counted (the caller counts, or the request is not one).
void write_error(httplib::Response& res, const ApiError& e);

// The same, counted by status in `metrics`; 429 and 503 carry Retry-After: `retry_after_s`
// (when the route expects a place to be free), so that clients back off.
void answer_error(httplib::Response& res, const ApiError& e, int retry_after_s,
                  ServerMetrics& metrics);

}  // namespace omni::http
