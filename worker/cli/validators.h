// CLI11 validators shared by the vllm-omni subcommands. Each returns "" or the reason, which
// CLI11 turns into "--flag: reason", naming what was expected and what was given. Their
// descriptions are empty so that --help shows the option's own type name (N, BYTES, a|b)
// instead of CLI11's generic one. CLI11 checks the text before converting it, so the integer
// checks also catch "2.5", which would otherwise fail as "Could not convert".
#pragma once

#include <string>
#include <vector>

namespace CLI {
class Validator;
}

namespace omni::cli {

CLI::Validator integer_at_least(long long min);
CLI::Validator unsigned_integer();  // digits only, fits 64 bits
// A number in [min, max] (or (min, max] with `min_open`); max HUGE_VAL: no upper bound.
CLI::Validator number_in(double min, double max, bool min_open = false);
// A byte size above 0 ("4GiB", "512MB", "123"; cpu_offload/option_values.h), rewritten as its
// number of bytes: give it to ->transform(), so that the option reads an integer.
CLI::Validator positive_byte_size();
// One of `names` exactly (for the engine's options, cpu_offload/option_names.h lists them).
CLI::Validator one_of(const std::vector<std::string>& names);

}  // namespace omni::cli
