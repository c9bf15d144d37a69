// The one table of a stage's engine options: each key of `engine_args` with its type, default,
// command-line flags and help. The YAML reader and --stage-overrides set fields through it, the
// commands (generate, serve, worker) register their offload flags from it (worker/cli/
// engine_flags.h), and the launcher serialises a resolved stage for its worker with it.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"

namespace omni::config {

struct EngineOption {
  enum class Type { kFlag, kValue, kList };  // a switch; one value; comma-separated values
  std::string key;                           // the engine_args key
  Type type = Type::kValue;
  std::vector<std::string> flags;    // command-line names, the first shown; none: YAML only
  std::vector<std::string> negated;  // a switch's names that set it false ("--no-...")
  std::string value_name;            // --help's placeholder (BYTES, alternating|sequential)
  std::string help;
  // The option's keys; one of them given on the command line makes this flag meaningful there
  // (without a stage config, "--a requires --b" otherwise).
  std::vector<std::string> needs_any;
  // Reads `value` (null: the default) into the field; throws ConfigError prefixed with
  // value.where.
  std::function<void(StageEngineArgs&, const detail::RawValue&, const detail::SetContext&)> set;
  std::function<nlohmann::json(const StageEngineArgs&)> get;  // the field as the YAML writes it
};

// Every engine_args key, in the order --help lists them.
const std::vector<EngineOption>& engine_options();
const EngineOption* find_engine_option(const std::string& key);

// A stage's engine options as an engine_args JSON object (what --stage-overrides reads).
nlohmann::json engine_args_json(const StageEngineArgs& engine);

// Engine options given on a command line, in the table's order (a later entry wins over an
// earlier one of the same key). `flag` names the flag for errors.
struct EngineFlag {
  std::string key;
  std::string flag;
  std::vector<std::string> values;  // one for a value or a switch ("true"/"false"); a list's items
};
using EngineFlags = std::vector<EngineFlag>;

// `key` given `values` under its first flag's name, as a program that builds its own flags (a
// bench, a test) gives them; throws std::invalid_argument for a key with no flag.
EngineFlag engine_flag(const std::string& key, std::vector<std::string> values);

// The last value given for `key`, if any.
std::optional<std::string> given_value(const EngineFlags& flags, const std::string& key);

}  // namespace omni::config
