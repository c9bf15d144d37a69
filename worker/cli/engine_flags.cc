#include "worker/cli/engine_flags.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace omni::cli {
namespace {

using config::EngineOption;

// "a,b" for CLI11's option names.
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

// The option's parser as a CLI11 check; its reason without the key it starts with (CLI11 puts
// the flag in front).
CLI::Validator parsed_by(const EngineOption& option) {
  return CLI::Validator(
      [&option](std::string& text) -> std::string {
        config::detail::RawValue value;
        value.kind = config::detail::RawValue::Kind::kScalar;
        value.text = text;
        config::StageEngineArgs scratch;
        config::detail::SetContext context;
        context.check_model_dirs = false;
        try {
          option.set(scratch, value, context);
          return "";
        } catch (const config::ConfigError& e) {
          std::string why = e.what();
          if (why.rfind(option.key + ": ", 0) == 0) why = why.substr(option.key.size() + 2);
          if (why.rfind(option.key + " ", 0) == 0) why = why.substr(option.key.size() + 1);
          return why;
        }
      },
      "");
}

std::string default_text(const EngineOption& option) {
  const nlohmann::json value = option.get(config::StageEngineArgs{});
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::vector<std::string> items;
    for (const auto& item : value) items.push_back(item.get<std::string>());
    return joined(items);
  }
  return value.dump();
}

}  // namespace

void add_engine_flags(CLI::App& app, config::EngineFlags& given) {
  for (const EngineOption& option : config::engine_options()) {
    const std::string& key = option.key;
    if (option.type == EngineOption::Type::kFlag) {
      const auto record = [&given, key](const std::string& flag, bool on) {
        return [&given, key, flag, on] { given.push_back({key, flag, {on ? "true" : "false"}}); };
      };
      if (!option.flags.empty()) {
        app.add_flag_callback(joined(option.flags), record(option.flags.front(), true),
                              option.help);
      }
      if (!option.negated.empty()) {
        app.add_flag_callback(
            joined(option.negated), record(option.negated.front(), false),
            option.flags.empty() ? option.help : "the opposite of " + option.flags.front());
      }
      continue;
    }
    // Each name is an option of its own, so that an error names the one the user typed.
    for (const std::string& flag : option.flags) {
      const std::string help =
          flag == option.flags.front() ? option.help : "the same as " + option.flags.front();
      CLI::Option* o = nullptr;
      if (option.type == EngineOption::Type::kList) {
        o = app.add_option_function<std::vector<std::string>>(
                   flag,
                   [&given, key, flag](const std::vector<std::string>& values) {
                     given.push_back({key, flag, values});
                   },
                   help)
                ->delimiter(',')
                ->allow_extra_args(false);
      } else {
        o = app.add_option_function<std::string>(
                   flag,
                   [&given, key, flag](const std::string& value) {
                     given.push_back({key, flag, {value}});
                   },
                   help)
                ->check(parsed_by(option));
      }
      o->type_name(option.value_name)->default_str(default_text(option));
    }
  }
}

void check_engine_flag_needs(const CLI::App& app) {
  const auto given = [&app](const EngineOption& option) {
    for (const auto* names : {&option.flags, &option.negated}) {
      for (const auto& name : *names) {
        if (app.get_option_no_throw(name) != nullptr && app.get_option(name)->count() > 0) {
          return true;
        }
      }
    }
    return false;
  };
  for (const EngineOption& option : config::engine_options()) {
    if (option.needs_any.empty() || !given(option)) continue;
    bool met = false;
    for (const auto& key : option.needs_any) met = met || given(*config::find_engine_option(key));
    if (!met) {
      const EngineOption& first = *config::find_engine_option(option.needs_any.front());
      const std::string& name =
          option.flags.empty() ? option.negated.front() : option.flags.front();
      throw CLI::RequiresError(name, first.flags.front());
    }
  }
}

}  // namespace omni::cli
