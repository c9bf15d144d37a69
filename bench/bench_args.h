// Command lines of the benchmarks, through CLI11: --help lists every option with its default;
// an unknown flag, a missing or malformed value is one line on stderr and exit status 2; an
// error while running is one line and exit status 1.
#pragma once

#include <c10/core/ScalarType.h>
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/dtype_name.h"
#include "cpu_offload/error_reason.h"

namespace omni::bench {

// --dtype values: auto, float32 (fp32), bfloat16 (bf16), float16 (fp16); auto is Undefined (the
// runners then take the checkpoint's dtype).
inline at::ScalarType parse_dtype(const std::string& s) { return offload::scalar_type_of(s); }

// "a,b,,c" -> {"a", "b", "c"}: the comma-separated lists of the benchmarks' flags.
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A CLI11 check that accepts what `parse` accepts (it throws on anything else), so the
// engine's parsers (parse_strategy, parse_granularity, ...) stay the one list of names and
// aliases while a typo still fails as a bad command line.
template <typename Parse>
CLI::Validator parsed_by(Parse parse) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return "";
        } catch (const std::exception& e) {
          return reason_of(e);
        }
      },
      "");
}

// A number >= `min` (integers: CLI11 rejects "2.5" for an integer option while converting).
inline CLI::Validator at_least(double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        try {
          size_t used = 0;
          if (std::stod(text, &used) >= min && used == text.size()) return "";
        } catch (const std::exception&) {
        }
        std::ostringstream why;
        why << "expected a number >= " << min << ", got '" << text << "'";
        return why.str();
      },
      "");
}

// main() of a benchmark: parses argv into `app` (whose options are bound to the benchmark's
// variables), then calls run().
template <typename Run>
int bench_main(CLI::App& app, int argc, char** argv, Run run) {
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": " + e.what() + " (see --help)\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // 0 after --help
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace omni::bench
