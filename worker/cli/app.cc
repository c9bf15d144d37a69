#include "worker/cli/app.h"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cpu_offload/logging.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/intra_op_threads.h"

namespace omni::cli {
namespace {

// CLI11's default failure message adds "Run with --help for more information." on a second
// line (or the whole usage): here it is one line, with the subcommand's help named in it.
std::string failure_message(const CLI::App* app, const CLI::Error& e) {
  std::string command = app->get_name();
  for (const CLI::App* sub : app->get_subcommands()) command += " " + sub->get_name();
  std::string why = e.what();
  if (app->get_subcommands().empty() && e.get_name() == "RequiredError") {
    // "A subcommand is required", also when the word given is not one of them.
    std::string names;
    for (const CLI::App* sub : app->get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    const auto rest = app->remaining();
    why = rest.empty() || rest.front().rfind('-', 0) == 0
              ? "a subcommand is required (one of: " + names + ")"
              : "unknown subcommand '" + rest.front() + "' (one of: " + names + ")";
  }
  return "vllm-omni: error: " + one_line(why) + " (see '" + command + " --help')\n";
}

}  // namespace

std::unique_ptr<CLI::App> make_app(CommandLine& commands) {
  auto app = std::make_unique<CLI::App>(
      "Runs Qwen3-Omni checkpoints (thinker -> talker -> code2wav) with CPU offload.", "vllm-omni");
  app->require_subcommand(1);
  app->failure_message(failure_message);
  CLI::App* generate = app->add_subcommand(
      "generate",
      "Answer one prompt (text, audio and image files) in text and speech, in this process: "
      "the text streams to stdout, the waveform goes to --output-wav");
  add_generate_options(*generate, commands.generate);
#ifdef OMNI_HAVE_SERVER
  CLI::App* worker = app->add_subcommand(
      "worker",
      "Serve one stage of a stage config over gRPC (the orchestrator of generate "
      "--stage-configs-path starts these itself; start one by hand for runtime.address)");
  add_worker_options(*worker, commands.worker);
#endif
#ifdef OMNI_HAVE_HTTP
  CLI::App* serve = app->add_subcommand(
      "serve",
      "Serve the OpenAI chat completions API (text and speech, streamed or not) over a "
      "checkpoint in this process (--model) or its stage workers (--stage-configs-path)");
  add_serve_options(*serve, commands.serve);
#endif
  return app;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv,
                                      std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    // exit() prints help for --help (status 0) and failure_message otherwise; every bad
    // command line exits 2, whatever CLI11's own code for the error kind.
    return app.exit(e, out, err) == 0 ? 0 : 2;
  }
}

int main(int argc, const char* const* argv) {
  CommandLine commands;
  const auto app = make_app(commands);
#ifdef OMNI_HAVE_HTTP
  // `vllm-omni --model M [flags]` is `vllm-omni serve --model M [flags]`, as in vLLM-Omni: an
  // option where the subcommand would be (other than --help) means serve.
  std::vector<const char*> args(argv, argv + argc);
  if (argc > 1 && std::string(argv[1]).rfind("--", 0) == 0 && std::string(argv[1]) != "--help") {
    args.insert(args.begin() + 1, "serve");
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
#endif
  if (const auto status = parse_command_line(*app, argc, argv, std::cout, std::cerr)) {
    return *status;
  }
  default_intra_op_threads();  // before any model op and any stage thread
  if (app->got_subcommand("generate")) {
    // Progress lines are for people watching a terminal, not for logs and pipes; the engine's
    // info lines likewise, unless OMNI_LOG_LEVEL asks for them.
    const bool terminal = ::isatty(2) == 1;
    if (!terminal && std::getenv("OMNI_LOG_LEVEL") == nullptr) {
      set_log_level(LogLevel::kWarning);
    }
    return run_generate(commands.generate, {std::cout, std::cerr, terminal});
  }
#ifdef OMNI_HAVE_SERVER
  if (app->got_subcommand("worker")) {
    if (std::getenv("OMNI_LOG_LEVEL") == nullptr && ::isatty(2) != 1) {
      set_log_level(LogLevel::kWarning);
    }
    return run_worker(commands.worker, std::cerr);
  }
#endif
#ifdef OMNI_HAVE_HTTP
  if (app->got_subcommand("serve")) {
    if (std::getenv("OMNI_LOG_LEVEL") == nullptr && ::isatty(2) != 1) {
      set_log_level(LogLevel::kWarning);
    }
    return run_serve(commands.serve, std::cerr);
  }
#endif
  return 2;  // unreachable: a subcommand is required
}

}  // namespace omni::cli
