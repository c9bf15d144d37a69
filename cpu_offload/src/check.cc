#include "cpu_offload/check.h"

#include "cpu_offload/error_reason.h"

#include <cstring>

namespace omni::detail {
namespace {
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(str_cat(message, " [", base_name(file), ":", line, "]"));
}

void throw_check_failure(const char* file, int line, const char* condition,
                         const std::string& message) {
  throw Error(str_cat(message.empty() ? std::string("check failed") : message, " (expected ",
                      condition, ") [", base_name(file), ":", line, "]"));
}
}  // namespace omni::detail

namespace omni {

std::string reason_of(const std::exception& e) {
  std::string text = e.what();
  const auto at = text.rfind(" [");
  if (at != std::string::npos && !text.empty() && text.back() == ']') text.resize(at);
  return text;
}

}  // namespace omni
