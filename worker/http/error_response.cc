#include "worker/http/error_response.h"

#include <httplib.h>

#include <string>

#include "worker/http/server_metrics.h"

namespace omni::http {

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.json(), "application/json");
}

void answer_error(httplib::Response& res, const ApiError& e, int retry_after_s,
                  ServerMetrics& metrics) {
  write_error(res, e);
  if (e.status == 429 || e.status == 503) {
    res.set_header("Retry-After", std::to_string(retry_after_s));
  }
  metrics.count_request(e.status);
}

}  // namespace omni::http
