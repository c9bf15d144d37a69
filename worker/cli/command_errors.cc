#include "worker/cli/command_errors.h"

#include <c10/util/Exception.h>

#include "cpu_offload/check.h"
#include "cpu_offload/error_reason.h"
#include "cpu_offload/logging.h"
#include "worker/config/stage_config.h"

namespace omni::cli {

std::string one_line(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return message;
}

int report_command_error(const std::exception_ptr& error, const std::string& prefix,
                         std::ostream& err) {
  int status = 1;
  std::string why;
  try {
    std::rethrow_exception(error);
  } catch (const BadInput& e) {
    why = e.what();
    status = 2;
  } catch (const config::ConfigError& e) {
    why = e.what();
    status = 2;
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const omni::Error& e) {
    // The reason only: where in the source it was thrown is for developers.
    why = log_level() > LogLevel::kDebug ? reason_of(e) : e.what();
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an unknown error";
  }
  err << prefix << ": error: " << one_line(why) << std::endl;
  return status;
}

}  // namespace omni::cli
