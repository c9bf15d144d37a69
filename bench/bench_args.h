// Command-line flags of the benchmarks: --name value, --name=value, or a bare --switch.
// Unknown flags, a missing value or a non-numeric number are errors naming the flag.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <string>

#include "cpu_offload/check.h"

namespace omni::bench {

struct Args {
  std::map<std::string, std::string> values;
  bool has(const std::string& k) const { return values.count(k) > 0; }
  std::string get(const std::string& k, const std::string& def) const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
  double number(const std::string& k, double def) const {
    if (!has(k)) return def;
    const std::string& text = values.at(k);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    OMNI_CHECK(end && *end == '\0' && !text.empty(), "--", k, " expects a number, got '", text,
               "'");
    return v;
  }
};

// `flags`: name -> whether it takes a value.
inline Args parse_args(int argc, char** argv, const std::map<std::string, bool>& flags) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    OMNI_CHECK(arg.rfind("--", 0) == 0, "unexpected argument '", arg, "' (see --help)");
    arg = arg.substr(2);
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto flag = flags.find(arg);
    OMNI_CHECK(flag != flags.end(), "unknown option '--", arg, "' (see --help)");
    if (flag->second && value.empty()) {
      OMNI_CHECK(i + 1 < argc, "option '--", arg, "' needs a value");
      value = argv[++i];
    }
    args.values[arg] = flag->second ? value : "1";
  }
  return args;
}

// --dtype values: float32 (fp32), bfloat16 (bf16), float16 (fp16).
inline at::ScalarType parse_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32") return at::kFloat;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "float16" || s == "fp16") return at::kHalf;
  OMNI_THROW("--dtype: unknown dtype '", s, "' (float32, bfloat16, float16)");
}

// main() of a command-line tool: runs `run`, turning an exception into "name: message" on
// stderr and exit status 2.
template <typename Run>
int guarded_main(const char* name, Run run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace omni::bench
