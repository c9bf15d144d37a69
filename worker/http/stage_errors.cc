#include "worker/http/stage_errors.h"

#include <mutex>
#include <random>
#include <sstream>

#include "cpu_offload/logging.h"

namespace omni::http {

std::string random_id(const char* prefix) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  std::ostringstream id;
  id << prefix << std::hex << rng();
  return id.str();
}

std::string published(const std::string& internal) {
  const std::string id = random_id("err-");
  // A client can cause these in a loop (a request a stage refuses): lines at a bounded rate.
  static RateLimitedLog log(LogLevel::kWarning);
  log.write("error " + id + ": " + internal);
  return public_error_message(internal) + " (error id " + id + ")";
}

ApiError stage_error(const pipeline::StageError& e) {
  ApiError a;
  if (e.code() == pipeline::StageError::Code::kInvalidArgument) {
    a.status = 400;
    a.type = "invalid_request_error";
  } else if (e.code() == pipeline::StageError::Code::kDeadlineExceeded) {
    a.status = 504;
    a.type = "server_error";
    a.code = "timeout";
  } else if (e.code() == pipeline::StageError::Code::kResourceExhausted) {
    a.status = 429;  // a full stage queue: the OpenAI clients retry this with backoff
    a.type = "rate_limit_error";
    a.code = "stage_queue_full";
  } else if (e.code() == pipeline::StageError::Code::kUnavailable) {
    a.status = 503;
    a.type = "server_error";
    a.code = "stage_unavailable";
  } else {
    a.status = 500;
    a.type = "server_error";
    a.code = "stage_failed";
  }
  a.message = published(e.what());
  return a;
}

}  // namespace omni::http
