// Error reporting inside the engine: exceptions that carry where and why.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace omni {

// Every error the engine and runner raise. Process and RPC boundaries catch it once and turn
// it into a status and a message for the user.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& message);
}  // namespace detail
}  // namespace omni

// OMNI_CHECK(cond, parts...): throws omni::Error naming the failed condition, the source
// location and the message (the parts are streamed together).
#define OMNI_CHECK(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      ::omni::detail::throw_check_failure(__FILE__, __LINE__, #cond,             \
                                          ::omni::detail::str_cat(__VA_ARGS__)); \
    }                                                                            \
  } while (0)

// OMNI_THROW(parts...): throws omni::Error with the message and the source location.
#define OMNI_THROW(...) \
  ::omni::detail::throw_error(__FILE__, __LINE__, ::omni::detail::str_cat(__VA_ARGS__))
