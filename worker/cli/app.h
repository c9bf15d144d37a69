// The vllm-omni command line: one CLI11 app with a subcommand per front end, each filling a
// plain options struct. Today: generate (a whole checkpoint in this process). serve and worker
// slot in the same way: an options struct in CommandLine, add_*_options, a run_* function.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>

#include "worker/cli/generate_options.h"
#include "worker/cli/serve_command.h"
#include "worker/cli/worker_command.h"

namespace CLI {
class App;
}

namespace omni::cli {

// What the command line asked for, one struct per subcommand.
struct CommandLine {
  GenerateOptions generate;
  WorkerOptions worker;  // builds with the server parts only
  ServeOptions serve;    // builds with the server parts and cpp-httplib only
};

// The app, its options bound to `commands` (which must outlive it). A subcommand is required.
std::unique_ptr<CLI::App> make_app(CommandLine& commands);

// Parses argv (argv[0] is the program). Returns nullopt when the chosen subcommand should run,
// else the exit status: 0 after --help (printed on `out`), 2 after a bad command line (one
// line on `err` that says why: no usage dump).
std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv,
                                      std::ostream& out, std::ostream& err);

// main(): parses, then runs the subcommand; 0, 1 (runtime error) or 2 (bad command line).
int main(int argc, const char* const* argv);

}  // namespace omni::cli
