// The one error ladder of vllm-omni's commands (generate, serve, worker): an exception that ends
// a command becomes one line on stderr, "PREFIX: error: REASON", and an exit status: 2 for a
// mistake in what the user gave (a stage config, a flag's value), 1 for everything else.
#pragma once

#include <exception>
#include <ostream>
#include <stdexcept>
#include <string>

namespace omni::cli {

// A mistake in what the user gave (a bad stage config, an unreadable --messages file): the
// command exits 2, as for a bad flag.
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `message` on one line (line breaks become spaces): every error the CLI prints is one line.
std::string one_line(std::string message);

// Writes `error` to `err` as "PREFIX: error: REASON" and returns the exit status: 2 for
// BadInput and config::ConfigError, 1 otherwise. The reason drops omni::Error's source location
// (kept with OMNI_LOG_LEVEL=debug) and c10::Error's backtrace.
int report_command_error(const std::exception_ptr& error, const std::string& prefix,
                         std::ostream& err);

}  // namespace omni::cli
